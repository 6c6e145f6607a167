/* A Bison parser, made by GNU Bison 3.8.2.  */
/* SPDX-License-Identifier: GPL-3.0-or-later WITH Bison-exception-2.2 */
int yyparse(void);

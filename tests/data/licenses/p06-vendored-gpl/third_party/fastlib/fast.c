int fast(void) { return 1; }

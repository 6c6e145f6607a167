print('no license anywhere')

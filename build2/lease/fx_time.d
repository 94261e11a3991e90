build2/lease/fx_time.o: lease/fx_time.c lease/fx_time.h
lease/fx_time.h:

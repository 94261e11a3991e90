build2/lease/fx_err.o: lease/fx_err.c lease/fx_err.h
lease/fx_err.h:

build2/lease/fx_b64.o: lease/fx_b64.c lease/fx_b64.h
lease/fx_b64.h:

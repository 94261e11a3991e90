build2/lease/fx_log.o: lease/fx_log.c lease/fx_log.h lease/fx_time.h
lease/fx_log.h:
lease/fx_time.h:

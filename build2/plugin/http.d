build2/plugin/http.o: plugin/http.c lease/fx_log.h lease/fx_time.h \
 plugin/http.h lease/fx_err.h plugin/metrics.h
lease/fx_log.h:
lease/fx_time.h:
plugin/http.h:
lease/fx_err.h:
plugin/metrics.h:

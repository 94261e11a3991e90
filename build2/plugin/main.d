build2/plugin/main.o: plugin/main.c plugin/config.h plugin/daemon.h \
 lease/fx_err.h lease/fx_log.h
plugin/config.h:
plugin/daemon.h:
lease/fx_err.h:
lease/fx_log.h:

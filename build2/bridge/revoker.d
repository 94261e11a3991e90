build2/bridge/revoker.o: bridge/revoker.c bridge/revoker.h lease/etcd.h \
 lease/fx_err.h lease/fx_err.h lease/fx_log.h lease/fx_time.h
bridge/revoker.h:
lease/etcd.h:
lease/fx_err.h:
lease/fx_err.h:
lease/fx_log.h:
lease/fx_time.h:

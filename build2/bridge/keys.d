build2/bridge/keys.o: bridge/keys.c bridge/keys.h lease/etcd.h \
 lease/fx_err.h lease/fx_err.h
bridge/keys.h:
lease/etcd.h:
lease/fx_err.h:
lease/fx_err.h:

build2/bridge/meta.o: bridge/meta.c bridge/meta.h lease/fx_err.h \
 bridge/keys.h lease/etcd.h lease/fx_err.h
bridge/meta.h:
lease/fx_err.h:
bridge/keys.h:
lease/etcd.h:
lease/fx_err.h:

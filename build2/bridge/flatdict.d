build2/bridge/flatdict.o: bridge/flatdict.c bridge/flatdict.h \
 lease/etcd.h lease/fx_err.h lease/fx_err.h
bridge/flatdict.h:
lease/etcd.h:
lease/fx_err.h:
lease/fx_err.h:

build2/bridge/segment.o: bridge/segment.c bridge/segment.h lease/etcd.h \
 lease/fx_err.h lease/fx_err.h
bridge/segment.h:
lease/etcd.h:
lease/fx_err.h:
lease/fx_err.h:

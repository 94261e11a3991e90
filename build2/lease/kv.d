build2/lease/kv.o: lease/kv.c lease/kv.h lease/etcd.h lease/fx_err.h
lease/kv.h:
lease/etcd.h:
lease/fx_err.h:

build2/lease/lease_mgr.o: lease/lease_mgr.c lease/lease_mgr.h \
 lease/etcd.h lease/fx_err.h lease/kv.h lease/fx_log.h lease/fx_time.h
lease/lease_mgr.h:
lease/etcd.h:
lease/fx_err.h:
lease/kv.h:
lease/fx_log.h:
lease/fx_time.h:

build2/bridge/mpsc.o: bridge/mpsc.c lease/fx_log.h lease/fx_time.h \
 bridge/mq_int.h bridge/fluxon_mq.h lease/etcd.h lease/fx_err.h \
 lease/fx_err.h lease/kv.h lease/etcd.h lease/lease_mgr.h lease/kv.h \
 bridge/keys.h bridge/meta.h bridge/segment.h
lease/fx_log.h:
lease/fx_time.h:
bridge/mq_int.h:
bridge/fluxon_mq.h:
lease/etcd.h:
lease/fx_err.h:
lease/fx_err.h:
lease/kv.h:
lease/etcd.h:
lease/lease_mgr.h:
lease/kv.h:
bridge/keys.h:
bridge/meta.h:
bridge/segment.h:

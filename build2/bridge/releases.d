build2/bridge/releases.o: bridge/releases.c lease/fx_log.h \
 bridge/mq_int.h bridge/fluxon_mq.h lease/etcd.h lease/fx_err.h \
 lease/fx_err.h lease/kv.h lease/etcd.h lease/lease_mgr.h lease/kv.h \
 bridge/keys.h bridge/meta.h
lease/fx_log.h:
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

build2/plugin/admin.o: plugin/admin.c plugin/admin.h plugin/config.h \
 bridge/fluxon_mq.h lease/etcd.h lease/fx_err.h lease/fx_err.h lease/kv.h \
 lease/etcd.h lease/lease_mgr.h lease/kv.h lease/fx_log.h bridge/mq_int.h \
 bridge/fluxon_mq.h bridge/keys.h bridge/meta.h
plugin/admin.h:
plugin/config.h:
bridge/fluxon_mq.h:
lease/etcd.h:
lease/fx_err.h:
lease/fx_err.h:
lease/kv.h:
lease/etcd.h:
lease/lease_mgr.h:
lease/kv.h:
lease/fx_log.h:
bridge/mq_int.h:
bridge/fluxon_mq.h:
bridge/keys.h:
bridge/meta.h:

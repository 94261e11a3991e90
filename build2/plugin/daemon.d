build2/plugin/daemon.o: plugin/daemon.c plugin/admin.h plugin/config.h \
 bridge/fluxon_mq.h lease/etcd.h lease/fx_err.h lease/fx_err.h lease/kv.h \
 lease/etcd.h lease/lease_mgr.h lease/kv.h plugin/daemon_int.h \
 plugin/daemon.h lease/fx_log.h plugin/http.h plugin/metrics.h \
 plugin/leaf.h lease/fx_time.h plugin/jsack.h
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
plugin/daemon_int.h:
plugin/daemon.h:
lease/fx_log.h:
plugin/http.h:
plugin/metrics.h:
plugin/leaf.h:
lease/fx_time.h:
plugin/jsack.h:

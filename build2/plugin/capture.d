build2/plugin/capture.o: plugin/capture.c plugin/daemon_int.h \
 plugin/config.h plugin/daemon.h lease/fx_err.h bridge/fluxon_mq.h \
 lease/etcd.h lease/fx_err.h lease/kv.h lease/etcd.h lease/lease_mgr.h \
 lease/kv.h lease/fx_log.h plugin/http.h plugin/metrics.h plugin/leaf.h \
 bridge/flatdict.h lease/fx_time.h plugin/jsack.h
plugin/daemon_int.h:
plugin/config.h:
plugin/daemon.h:
lease/fx_err.h:
bridge/fluxon_mq.h:
lease/etcd.h:
lease/fx_err.h:
lease/kv.h:
lease/etcd.h:
lease/lease_mgr.h:
lease/kv.h:
lease/fx_log.h:
plugin/http.h:
plugin/metrics.h:
plugin/leaf.h:
bridge/flatdict.h:
lease/fx_time.h:
plugin/jsack.h:

build2/lease/etcd.o: lease/etcd.c lease/etcd.h lease/fx_err.h \
 lease/etcd_json.h lease/fx_log.h lease/fx_time.h
lease/etcd.h:
lease/fx_err.h:
lease/etcd_json.h:
lease/fx_log.h:
lease/fx_time.h:

build2/lease/etcd_json.o: lease/etcd_json.c lease/etcd_json.h \
 lease/etcd.h lease/fx_err.h lease/fx_b64.h
lease/etcd_json.h:
lease/etcd.h:
lease/fx_err.h:
lease/fx_b64.h:

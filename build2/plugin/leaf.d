build2/plugin/leaf.o: plugin/leaf.c plugin/leaf.h lease/fx_err.h \
 lease/fx_log.h lease/fx_time.h plugin/subject.h
plugin/leaf.h:
lease/fx_err.h:
lease/fx_log.h:
lease/fx_time.h:
plugin/subject.h:

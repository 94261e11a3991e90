build2/plugin/config.o: plugin/config.c plugin/config.h plugin/leaf.h \
 lease/fx_err.h plugin/subject.h
plugin/config.h:
plugin/leaf.h:
lease/fx_err.h:
plugin/subject.h:

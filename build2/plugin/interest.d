build2/plugin/interest.o: plugin/interest.c plugin/interest.h \
 lease/fx_err.h
plugin/interest.h:
lease/fx_err.h:

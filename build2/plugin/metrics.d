build2/plugin/metrics.o: plugin/metrics.c plugin/metrics.h
plugin/metrics.h:

build2/plugin/jsack.o: plugin/jsack.c plugin/jsack.h
plugin/jsack.h:

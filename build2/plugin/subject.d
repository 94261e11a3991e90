build2/plugin/subject.o: plugin/subject.c plugin/subject.h
plugin/subject.h:

#include <stdio.h>
int main(void) { fprintf(stderr, "mcc: not built yet\n"); return 1; }

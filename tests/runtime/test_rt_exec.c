#include "rt_test.h"
int main(void) { return test_summary("test_rt_exec"); }

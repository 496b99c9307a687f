/* emu_dev.h - the emulated device for tests (emu_dev.c): runtime/device/device.h
 * over the CUDA emulator.  A test executable adds emu_dev.c and
 * emu_host.c (see emu_host.h for the definitions it needs). */
#ifndef TS_EMU_DEV_H
#define TS_EMU_DEV_H
#include "runtime/device/device.h"

/* A new emulated device (close with d->ops->close(d)). */
RtDev *ts_emu_dev_open(void);
/* What it ran so far: kernel launches, GEMMs, graph replays. */
void ts_emu_dev_counts(RtDev *d, long long *launches, long long *gemms, long long *replays);
/* Launches since the last ts_emu_dev_launches_reset (or the start) of the
 * kernels whose name starts with prefix. */
void ts_emu_dev_launches_reset(RtDev *d);
long long ts_emu_dev_launches_of(RtDev *d, const char *prefix);

#endif

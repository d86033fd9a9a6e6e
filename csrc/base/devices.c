/*
 * base/devices.c: each device's primary context, and synchronising devices.
 *
 * (A "context" elsewhere in the core is an entry of watch mode's context
 * table, capture/contexts.c: a context launches were seen in, with its slots.)
 *
 * We retain each device's primary context once and never release it: the
 * frameworks share the same primary context and tear it down at exit.
 * Callers push/pop a context around their work rather than replacing the
 * thread's current one.
 */
#include "base/base.h"

static CUcontext retained[CD_MAX_DEVICES];
static pthread_mutex_t retain_lock = PTHREAD_MUTEX_INITIALIZER;

int cd_device_context(int ordinal, CUcontext *ctx)
{
    int rc = cd_driver_ready();
    if (rc != 0)
        return rc < 0 ? CUDA_ERROR_NOT_INITIALIZED : rc;
    if (ordinal < 0 || ordinal >= CD_MAX_DEVICES)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&retain_lock);
    if (!retained[ordinal]) {
        CUdevice dev;
        if ((rc = CU_CHECK(cd_drv.cuDeviceGet(&dev, ordinal))) == 0)
            rc = CU_CHECK(cd_drv.cuDevicePrimaryCtxRetain(&retained[ordinal], dev));
    }
    *ctx = retained[ordinal];
    pthread_mutex_unlock(&retain_lock);
    return rc;
}

static int sync_context(CUcontext ctx)
{
    CUcontext popped;
    int rc = CU_CHECK(cd_drv.cuCtxPushCurrent(ctx));
    if (rc == 0) {
        rc = CU_CHECK(cd_drv.cuCtxSynchronize());
        cd_drv.cuCtxPopCurrent(&popped);
    }
    return rc;
}

int cd_sync_device(int ordinal)
{
    CUcontext ctx;
    int rc = cd_device_context(ordinal, &ctx);
    return rc ? rc : sync_context(ctx);
}

int cd_sync_current_or_active(void)
{
    int rc = cd_driver_ready();
    if (rc != 0)
        return rc < 0 ? CUDA_ERROR_NOT_INITIALIZED : rc;
    CUcontext ctx = NULL;
    if ((rc = CU_CHECK(cd_drv.cuCtxGetCurrent(&ctx))))
        return rc;
    if (ctx)
        return CU_CHECK(cd_drv.cuCtxSynchronize());
    int n = 0;
    rc = CU_CHECK(cd_drv.cuDeviceGetCount(&n));
    for (int i = 0; rc == 0 && i < n; i++) {
        CUdevice dev;
        unsigned flags;
        int active = 0;
        if ((rc = CU_CHECK(cd_drv.cuDeviceGet(&dev, i))) ||
            (rc = CU_CHECK(cd_drv.cuDevicePrimaryCtxGetState(dev, &flags, &active))) || !active)
            continue;
        rc = cd_sync_device(i);
    }
    return rc;
}

void cd_devices_fork(int op)
{
    cd_fork_lock(&retain_lock, op);
}

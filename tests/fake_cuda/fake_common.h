/*
 * fake_common.h: the interface between the fake libcuda.so.1 (fake_cuda.c and
 * the other files of fake_driver.h, which own all state: device, streams,
 * contexts, the CUPTI subscriber registry) and the fake libcupti.so.13 (fake_cupti.c, a thin layer that
 * links against libcuda.so.1, like the real CUPTI depends on the driver).
 * Test-only code: see tests/fake_cuda/__init__.py. Built against the project's
 * own CUDA declarations (csrc/base/cuda_api.h, on the include path as in csrc/),
 * so that no CUDA toolkit is needed.
 */
#ifndef FAKE_COMMON_H
#define FAKE_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include "base/cuda_api.h"

#define FAKE_EXPORT __attribute__((visibility("default")))

FAKE_EXPORT CUptiResult fakecuda_cupti_subscribe(CUpti_SubscriberHandle *sub,
                                                 CUpti_CallbackFunc cb, void *ud,
                                                 const char *name, char *old, size_t oldsize);
FAKE_EXPORT CUptiResult fakecuda_cupti_unsubscribe(CUpti_SubscriberHandle sub);
FAKE_EXPORT CUptiResult fakecuda_cupti_enable(uint32_t enable, CUpti_SubscriberHandle sub,
                                              CUpti_CallbackDomain domain,
                                              CUpti_CallbackId cbid);
FAKE_EXPORT CUptiResult fakecuda_cupti_finalize(void);
FAKE_EXPORT int fakecuda_ctx_valid(CUcontext ctx);
FAKE_EXPORT unsigned fakecuda_ctx_uid(CUcontext ctx);
FAKE_EXPORT int fakecuda_initialised(void);

#endif

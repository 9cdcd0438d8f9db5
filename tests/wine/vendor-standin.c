/*
 * Test fixture: one stand-in for the vendor DLLs `dxdp validate` probes (nvcuda.dll, nvml.dll,
 * OpenCL.dll, vulkan-1.dll, nvEncodeAPI64.dll, amfrt64.dll, libvpl.dll). It exports each API's
 * documented entry points with canned answers; tests/daemon/validate.rs copies it under each name.
 *
 * DXDP_STANDIN_MODE chooses how the API's first call behaves: unset or "ok" answers, "fail"
 * returns the API's documented error (CUDA_ERROR_NO_DEVICE, NVML_ERROR_DRIVER_NOT_LOADED,
 * CL_PLATFORM_NOT_FOUND_KHR, VK_ERROR_INITIALIZATION_FAILED, NV_ENC_ERR_NO_ENCODE_DEVICE,
 * AMF_FAIL, MFXLoad returning NULL), "hang" never returns. Built by .ci/windows.sh with
 * mingw-w64 next to the test executables; it never ships.
 */
#include <windows.h>
#include <stdint.h>
#include <string.h>

#define EXPORT __declspec(dllexport)

static const char NAME[] = "Stand-in GPU";

static int mode(void)
{
    char buf[16];
    DWORD n = GetEnvironmentVariableA("DXDP_STANDIN_MODE", buf, sizeof buf);
    if (n == 0 || n >= sizeof buf) {
        return 0;
    }
    if (strcmp(buf, "fail") == 0) {
        return 1;
    }
    if (strcmp(buf, "hang") == 0) {
        return 2;
    }
    return 0;
}

/* 0 when the call answers, else `error`; never returns in "hang" mode. */
static int gate(int error)
{
    int m = mode();
    while (m == 2) {
        Sleep(INFINITE);
    }
    return m == 1 ? error : 0;
}

static void copy_name(char *out, size_t len)
{
    if (out != NULL && len > 0) {
        strncpy(out, NAME, len - 1);
        out[len - 1] = 0;
    }
}

/* CUDA driver API */
EXPORT int cuInit(unsigned flags) { (void)flags; return gate(100); }
EXPORT int cuDriverGetVersion(int *v) { *v = 12040; return 0; }
EXPORT int cuDeviceGetCount(int *n) { *n = 1; return 0; }
EXPORT int cuDeviceGet(int *d, int i) { *d = i; return 0; }
EXPORT int cuDeviceGetName(char *name, int len, int dev) { (void)dev; copy_name(name, (size_t)len); return 0; }

/* NVML */
EXPORT int nvmlInit_v2(void) { return gate(9); }
EXPORT int nvmlShutdown(void) { return 0; }
EXPORT int nvmlDeviceGetCount_v2(unsigned *n) { *n = 1; return 0; }
EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { *h = (void *)(uintptr_t)(i + 1); return 0; }
EXPORT int nvmlDeviceGetName(void *h, char *name, unsigned len) { (void)h; copy_name(name, len); return 0; }

/* OpenCL */
EXPORT int clGetPlatformIDs(unsigned n, void **platforms, unsigned *count)
{
    int rc = gate(-1001);
    if (rc != 0) {
        return rc;
    }
    if (count != NULL) {
        *count = 1;
    }
    if (platforms != NULL && n > 0) {
        platforms[0] = (void *)1;
    }
    return 0;
}
EXPORT int clGetDeviceIDs(void *platform, uint64_t type, unsigned n, void **devices, unsigned *count)
{
    (void)platform;
    (void)type;
    if (count != NULL) {
        *count = 1;
    }
    if (devices != NULL && n > 0) {
        devices[0] = (void *)2;
    }
    return 0;
}
EXPORT int clGetDeviceInfo(void *device, unsigned param, size_t size, void *value, size_t *ret)
{
    (void)device;
    (void)param;
    copy_name((char *)value, size);
    if (ret != NULL) {
        *ret = sizeof NAME;
    }
    return 0;
}

/* Vulkan */
EXPORT int vkCreateInstance(const void *info, const void *allocator, void **instance)
{
    (void)info;
    (void)allocator;
    int rc = gate(-3);
    if (rc == 0) {
        *instance = (void *)1;
    }
    return rc;
}
EXPORT int vkEnumeratePhysicalDevices(void *instance, uint32_t *count, void **devices)
{
    (void)instance;
    if (devices != NULL && *count > 0) {
        devices[0] = (void *)2;
    }
    *count = 1;
    return 0;
}
EXPORT void vkGetPhysicalDeviceProperties(void *device, uint8_t *props)
{
    uint32_t version = (1u << 22) | (3u << 12) | 250u; /* 1.3.250 */
    (void)device;
    memset(props, 0, 824);
    memcpy(props, &version, sizeof version);
    copy_name((char *)props + 20, 256);
}
EXPORT void vkDestroyInstance(void *instance, const void *allocator) { (void)instance; (void)allocator; }

/* NVENC */
EXPORT int NvEncodeAPIGetMaxSupportedVersion(uint32_t *v)
{
    int rc = gate(1);
    if (rc == 0) {
        *v = (12u << 4) | 2u; /* 12.2 */
    }
    return rc;
}

/* AMF */
EXPORT int AMFQueryVersion(uint64_t *v)
{
    int rc = gate(1);
    if (rc == 0) {
        *v = (1ull << 48) | (4ull << 32) | (33ull << 16) | 2ull; /* 1.4.33.2 */
    }
    return rc;
}

/* oneVPL dispatcher */
static uint8_t impl_desc[48];
EXPORT void *MFXLoad(void) { return gate(1) == 0 ? (void *)1 : NULL; }
EXPORT void MFXUnload(void *loader) { (void)loader; }
EXPORT int MFXEnumImplementations(void *loader, uint32_t i, uint32_t format, void **desc)
{
    uint16_t minor = 10, major = 2; /* API 2.10 */
    (void)loader;
    (void)format;
    if (i > 0) {
        return -9; /* MFX_ERR_NOT_FOUND */
    }
    memset(impl_desc, 0, sizeof impl_desc);
    memcpy(impl_desc + 12, &minor, 2);
    memcpy(impl_desc + 14, &major, 2);
    memcpy(impl_desc + 16, "Stand-in VPL", 13);
    *desc = impl_desc;
    return 0;
}
EXPORT int MFXDispReleaseImplDescription(void *loader, void *desc) { (void)loader; (void)desc; return 0; }

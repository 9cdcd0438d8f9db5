/*
 * Test fixture: a stand-in for dxcore.dll, which Wine lacks. Its adapter factory knows one
 * adapter, LUID 0x00000007:0x0000D1CE, described as "dxdp stand-in compute-only adapter": like a
 * compute-only (MCDM) adapter, DXGI does not list it, so a D3D12 device for it can only be asked
 * of DXCore's adapter. The adapter answers IUnknown and IDXCoreAdapter only (Wine's D3D12 then
 * refuses it, which the test expects: what it proves is which adapter D3D12CreateDevice was
 * given). Every other LUID gets E_INVALIDARG, as from DXCore; adapter lists are not implemented.
 * The vtable layouts follow dxcore_interface.h. Built by .ci/windows.sh with mingw-w64 next to
 * the test executables; it never ships.
 */
#include <windows.h>
#include <stdbool.h>
#include <string.h>

#define EXPORT __declspec(dllexport)

#ifndef DXGI_ERROR_UNSUPPORTED
#define DXGI_ERROR_UNSUPPORTED ((HRESULT)0x887A0004L)
#endif

static const GUID IID_IUnknown_ = {0x00000000, 0x0000, 0x0000, {0xc0, 0, 0, 0, 0, 0, 0, 0x46}};
static const GUID IID_IDXCoreAdapter_ = {
    0xf0db4c7f, 0xfe5a, 0x42a2, {0xbd, 0x62, 0xf2, 0xa6, 0xcf, 0x6f, 0xc8, 0x3e}};
static const GUID IID_IDXCoreAdapterFactory_ = {
    0x78ee5945, 0xc36e, 0x4b13, {0xa6, 0x69, 0x00, 0x5d, 0xd1, 0x1c, 0x0f, 0x06}};

static const char DESCRIPTION[] = "dxdp stand-in compute-only adapter";
#define STANDIN_LUID_HIGH 0x00000007
#define STANDIN_LUID_LOW 0x0000D1CEu
#define DRIVER_DESCRIPTION 2

typedef struct Object {
    void **vtable;
} Object;

static HRESULT WINAPI query(Object *self, const GUID *iid, void **out, const GUID *own)
{
    if (out == NULL) {
        return E_POINTER;
    }
    if (IsEqualGUID(iid, &IID_IUnknown_) || IsEqualGUID(iid, own)) {
        *out = self;
        return S_OK;
    }
    *out = NULL;
    return E_NOINTERFACE;
}

/* Both objects are static: reference counts are not kept. */
static ULONG WINAPI add_ref(Object *self)
{
    (void)self;
    return 2;
}

static ULONG WINAPI release(Object *self)
{
    (void)self;
    return 1;
}

/* IDXCoreAdapter */
static HRESULT WINAPI adapter_query(Object *self, const GUID *iid, void **out)
{
    return query(self, iid, out, &IID_IDXCoreAdapter_);
}
static bool WINAPI is_valid(Object *self)
{
    (void)self;
    return true;
}
static bool WINAPI is_attribute_supported(Object *self, const GUID *attribute)
{
    (void)self;
    (void)attribute;
    return false;
}
static bool WINAPI is_property_supported(Object *self, UINT property)
{
    (void)self;
    return property == DRIVER_DESCRIPTION;
}
static HRESULT WINAPI get_property(Object *self, UINT property, SIZE_T size, void *buffer)
{
    (void)self;
    if (property != DRIVER_DESCRIPTION) {
        return DXGI_ERROR_UNSUPPORTED;
    }
    if (buffer == NULL || size < sizeof DESCRIPTION) {
        return E_INVALIDARG;
    }
    memcpy(buffer, DESCRIPTION, sizeof DESCRIPTION);
    return S_OK;
}
static HRESULT WINAPI get_property_size(Object *self, UINT property, SIZE_T *size)
{
    (void)self;
    if (property != DRIVER_DESCRIPTION) {
        return DXGI_ERROR_UNSUPPORTED;
    }
    *size = sizeof DESCRIPTION;
    return S_OK;
}
static bool WINAPI no_state(Object *self, UINT state)
{
    (void)self;
    (void)state;
    return false;
}
static HRESULT WINAPI query_state(Object *self, UINT s, SIZE_T a, const void *b, SIZE_T c, void *d)
{
    (void)self, (void)s, (void)a, (void)b, (void)c, (void)d;
    return DXGI_ERROR_UNSUPPORTED;
}
static HRESULT WINAPI set_state(Object *self, UINT s, SIZE_T a, const void *b, SIZE_T c,
                                const void *d)
{
    (void)self, (void)s, (void)a, (void)b, (void)c, (void)d;
    return DXGI_ERROR_UNSUPPORTED;
}
static HRESULT WINAPI get_factory(Object *self, const GUID *iid, void **out);

static void *adapter_vtable[] = {
    adapter_query, add_ref,     release,           is_valid,  is_attribute_supported,
    is_property_supported,      get_property,      get_property_size, no_state,
    query_state,   no_state,    set_state,         get_factory,
};
static Object adapter = {adapter_vtable};

/* IDXCoreAdapterFactory */
static HRESULT WINAPI factory_query(Object *self, const GUID *iid, void **out)
{
    return query(self, iid, out, &IID_IDXCoreAdapterFactory_);
}
static HRESULT WINAPI create_adapter_list(Object *self, UINT n, const GUID *filter,
                                          const GUID *iid, void **out)
{
    (void)self, (void)n, (void)filter, (void)iid;
    if (out != NULL) {
        *out = NULL;
    }
    return E_NOTIMPL;
}
static HRESULT WINAPI get_adapter_by_luid(Object *self, const LUID *luid, const GUID *iid,
                                          void **out)
{
    (void)self;
    if (out == NULL || luid == NULL) {
        return E_POINTER;
    }
    *out = NULL;
    if (luid->HighPart != STANDIN_LUID_HIGH || luid->LowPart != STANDIN_LUID_LOW) {
        return E_INVALIDARG;
    }
    return adapter_query(&adapter, iid, out);
}
static bool WINAPI is_notification_type_supported(Object *self, UINT type)
{
    (void)self, (void)type;
    return false;
}
static HRESULT WINAPI register_event_notification(Object *self, void *object, UINT type,
                                                  void *callback, const void *context,
                                                  UINT *cookie)
{
    (void)self, (void)object, (void)type, (void)callback, (void)context, (void)cookie;
    return E_NOTIMPL;
}
static HRESULT WINAPI unregister_event_notification(Object *self, UINT cookie)
{
    (void)self, (void)cookie;
    return E_NOTIMPL;
}

static void *factory_vtable[] = {
    factory_query,
    add_ref,
    release,
    create_adapter_list,
    get_adapter_by_luid,
    is_notification_type_supported,
    register_event_notification,
    unregister_event_notification,
};
static Object factory = {factory_vtable};

static HRESULT WINAPI get_factory(Object *self, const GUID *iid, void **out)
{
    (void)self;
    return factory_query(&factory, iid, out);
}

EXPORT HRESULT WINAPI DXCoreCreateAdapterFactory(const GUID *iid, void **out)
{
    return factory_query(&factory, iid, out);
}

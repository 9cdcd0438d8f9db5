/*
 * Test fixture: a stand-in bcryptprimitives.dll for running Windows-target tests under Wine 8.
 *
 * Rust's std for Windows imports bcryptprimitives.dll!ProcessPrng, which Wine 8 lacks. This DLL
 * exports ProcessPrng and forwards to advapi32!SystemFunction036 (RtlGenRandom). It is built by
 * .ci/wine-tests with mingw-w64 and placed next to the test executables; it never ships.
 */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length)
{
    while (length > 0) {
        ULONG chunk = length > 0x7fffffff ? 0x7fffffff : (ULONG)length;
        if (!SystemFunction036(data, chunk)) {
            return FALSE;
        }
        data += chunk;
        length -= chunk;
    }
    return TRUE;
}

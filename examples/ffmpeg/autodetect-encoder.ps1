# Picks the H.264 hardware encoder of the GPU this container was given, by the vendor runtime
# files dxdp mounted into System32, and encodes 10 s of a 1080p test pattern with it.
$ErrorActionPreference = 'Stop'
$encoders = [ordered]@{
    'nvEncodeAPI64.dll'       = 'h264_nvenc'   # NVIDIA
    'amfrt64.dll'             = 'h264_amf'     # AMD
    'intel_gfx_api-x64.dll'   = 'h264_qsv'     # Intel (oneVPL / Media SDK dispatcher)
    'libmfxhw64.dll'          = 'h264_qsv'     # Intel (older Media SDK)
}
$found = $null
foreach ($dll in $encoders.Keys) {
    if (Test-Path (Join-Path $env:SystemRoot "System32\$dll")) {
        $found = $encoders[$dll]
        Write-Output "found ${dll}: using $found"
        break
    }
}
if (-not $found) {
    Write-Output "no hardware encoder runtime in System32 (looked for $($encoders.Keys -join ', '))"
    exit 1
}
& ffmpeg.exe -hide_banner -f lavfi -i 'testsrc2=size=1920x1080:rate=30' -t 10 -c:v $found -f null '-'
exit $LASTEXITCODE

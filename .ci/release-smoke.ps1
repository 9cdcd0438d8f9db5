<#
.SYNOPSIS
    Runs the release dxdp.exe on a Windows machine without a GPU (a GitHub runner) and checks
    what it must do there. Used by .github/workflows/ci.yml; docs/development.md says what this
    proves and what only a GPU node can.

.DESCRIPTION
    1. `dxdp.exe --version` names the x86_64-pc-windows-gnu build (the exe that ships).
    2. `dxdp.exe hcs` exits 0 (HCS answers on a host with the Containers feature).
    3. `dxdp.exe discover` exits 0 (no devices) or 1 with an `error: ` line, never a panic.
    4. `dxdp.exe doctor` exits 1, because a runner has no kubelet: the check "kubelet
       device-plugin directory" FAILs; `doctor -o json` says the same (`ok: false`). No panic.
    Throws on the first failure; exits 0 when everything held.
#>
param(
    # The exe to check.
    [Parameter(Mandatory = $true)]
    [string]$Dxdp
)

$ErrorActionPreference = 'Stop'
$Dxdp = (Resolve-Path -LiteralPath $Dxdp).Path
Write-Output "checking $Dxdp"

# Runs the exe; returns its exit code, stdout and stderr (never throws on a non-zero exit).
function Invoke-Dxdp {
    param([string[]]$Arguments)
    $out = [System.IO.Path]::GetTempFileName()
    $err = [System.IO.Path]::GetTempFileName()
    try {
        $p = Start-Process -FilePath $Dxdp -ArgumentList $Arguments -NoNewWindow -PassThru `
            -RedirectStandardOutput $out -RedirectStandardError $err
        $null = $p.Handle
        if (-not $p.WaitForExit(120000)) {
            Stop-Process -Id $p.Id -Force
            throw "dxdp $($Arguments -join ' ') did not finish within 120 s"
        }
        $result = [ordered]@{
            code = $p.ExitCode
            stdout = [System.IO.File]::ReadAllText($out)
            stderr = [System.IO.File]::ReadAllText($err)
        }
        Write-Output "--- dxdp $($Arguments -join ' '): exit $($result.code)" | Out-Host
        Write-Output $result.stdout | Out-Host
        Write-Output $result.stderr | Out-Host
        if (($result.stdout + $result.stderr) -match 'panicked') {
            throw "dxdp $($Arguments -join ' ') panicked"
        }
        return $result
    } finally {
        Remove-Item -LiteralPath $out, $err -ErrorAction SilentlyContinue
    }
}

# 1. The version line of the shipped build.
$r = Invoke-Dxdp @('--version')
if ($r.code -ne 0) { throw "dxdp --version exited $($r.code)" }
if ($r.stdout -notmatch '^dxdp \S+ \(commit \S+, x86_64-pc-windows-gnu\)') {
    throw "dxdp --version is not the x86_64-pc-windows-gnu release build: $($r.stdout)"
}

# 2. HCS on a real host.
$r = Invoke-Dxdp @('hcs')
if ($r.code -ne 0) { throw "dxdp hcs exited $($r.code)" }

# 3. Discovery without a GPU: no devices, or a clean error.
$r = Invoke-Dxdp @('discover')
$discovered = $r.code
if ($r.code -ne 0 -and $r.code -ne 1) { throw "dxdp discover exited $($r.code) (0 or 1 expected)" }
if ($r.code -eq 1 -and $r.stderr -notmatch '(?m)^error: ') { throw 'dxdp discover exited 1 without an error: line' }

# 4. The preflight: FAIL for the missing kubelet, exit 1.
$r = Invoke-Dxdp @('doctor')
if ($r.code -ne 1) { throw "dxdp doctor exited $($r.code); 1 expected on a runner without a kubelet" }
if ($r.stdout -notmatch 'FAIL') { throw 'dxdp doctor exited 1 without a FAIL line' }
$r = Invoke-Dxdp @('doctor', '-o', 'json')
if ($r.code -ne 1) { throw "dxdp doctor -o json exited $($r.code); 1 expected" }
$report = $r.stdout | ConvertFrom-Json
if ($report.kind -ne 'DoctorReport' -or $report.ok -ne $false) { throw 'doctor -o json: not a DoctorReport with ok: false' }
$dir = @($report.checks | Where-Object { $_.name -eq 'kubelet device-plugin directory' })
if ($dir.Count -ne 1 -or $dir[0].status -ne 'FAIL') {
    throw "doctor -o json: the kubelet device-plugin directory check is not FAIL: $($dir | ConvertTo-Json -Compress)"
}

Write-Output "the release dxdp.exe passed: --version, hcs, discover (exit $discovered), doctor (exit 1, as expected)"
exit 0

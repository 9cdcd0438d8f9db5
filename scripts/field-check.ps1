<#
.SYNOPSIS
    dxdp field verification kit: collects one bundle from a real Windows GPU node to attach to a
    bug report.

.DESCRIPTION
    Runs `dxdp snapshot`, `dxdp discover`, `dxdp doctor` and `dxdp hcs`; starts `dxdp plugin`
    against the node's real kubelet for a short time and stops it with Ctrl-C (checking that it
    removed its sockets); when kubectl is available, runs the device-discovery example Job
    (examples/device-discovery/display.yaml, pinned to this node); and
    writes everything (outputs, logs, versions, the host snapshot) into one folder and one .zip.

    Nothing is installed or changed on the node, except that the plugin registers with the
    kubelet for -PluginSeconds. If dxdp sockets are already in the kubelet directory (a dxdp
    DaemonSet serves this node, or a crashed run left them), the plugin step is skipped unless
    -Force is given.

    docs/field-verification.md explains the procedure and docs/troubleshooting.md how to read
    the bundle.

.EXAMPLE
    .\field-check.ps1 -Dxdp C:\dxdp\dxdp.exe

.EXAMPLE
    .\field-check.ps1 -Dxdp .\dxdp.exe -PluginSeconds 0 -SkipJob
#>
[CmdletBinding()]
param(
    # The dxdp executable to test.
    [string]$Dxdp = 'dxdp.exe',
    # Where the bundle folder and .zip are written.
    [string]$OutputDir = '.',
    # How long the plugin runs against the kubelet; 0 skips the plugin step.
    [int]$PluginSeconds = 20,
    # The kubelet's device-plugin directory; empty: dxdp's default (from %SystemDrive%).
    [string]$KubeletDir = '',
    # The example Job; empty: examples\device-discovery\display.yaml of the repository.
    [string]$JobManifest = '',
    # The image of the example Job (built from examples/device-discovery/Dockerfile); required
    # while the manifest names the placeholder registry.example.com.
    [string]$JobImage = '',
    # Skip the kubectl Job even when kubectl is available.
    [switch]$SkipJob,
    # Run the plugin step even when dxdp sockets are already in the kubelet directory.
    [switch]$Force
)

# No strict mode: a field check should record what it can and go on, never stop half-way.
$ErrorActionPreference = 'Continue'

$stamp = Get-Date -Format 'yyyyMMdd-HHmmss'
$bundle = Join-Path $OutputDir "dxdp-field-$($env:COMPUTERNAME)-$stamp"
New-Item -ItemType Directory -Path $bundle -Force | Out-Null
$summary = Join-Path $bundle 'summary.txt'

function Write-Summary {
    param([string]$Line)
    Write-Host $Line
    Add-Content -Path $summary -Value $Line -Encoding utf8
}

# Runs a program, writing stdout and stderr to files in the bundle; returns the exit code.
function Invoke-Logged {
    param(
        [string]$Name,
        [string]$FilePath,
        [string[]]$Arguments
    )
    $out = Join-Path $bundle "$Name.txt"
    $err = Join-Path $bundle "$Name.stderr.txt"
    try {
        $p = Start-Process -FilePath $FilePath -ArgumentList $Arguments -NoNewWindow -Wait -PassThru `
            -RedirectStandardOutput $out -RedirectStandardError $err
        Write-Summary ("{0,-22} exit {1}" -f $Name, $p.ExitCode)
        return $p.ExitCode
    } catch {
        Write-Summary ("{0,-22} could not run: {1}" -f $Name, $_.Exception.Message)
        return -1
    }
}

# Sends Ctrl-C to a process that has a console of its own, from a helper PowerShell process
# (attaching to another console would disturb this one). Returns whether the event was sent.
function Send-CtrlC {
    param([int]$ProcessId)
    $helper = @'
param([int]$ProcessId)
Add-Type -Namespace DxdpFieldCheck -Name Console -MemberDefinition @"
[DllImport("kernel32.dll", SetLastError=true)] public static extern bool FreeConsole();
[DllImport("kernel32.dll", SetLastError=true)] public static extern bool AttachConsole(uint id);
[DllImport("kernel32.dll", SetLastError=true)] public static extern bool SetConsoleCtrlHandler(System.IntPtr handler, bool add);
[DllImport("kernel32.dll", SetLastError=true)] public static extern bool GenerateConsoleCtrlEvent(uint ctrlEvent, uint group);
"@
[DxdpFieldCheck.Console]::FreeConsole() | Out-Null
if (-not [DxdpFieldCheck.Console]::AttachConsole([uint32]$ProcessId)) { exit 2 }
[DxdpFieldCheck.Console]::SetConsoleCtrlHandler([System.IntPtr]::Zero, $true) | Out-Null
if (-not [DxdpFieldCheck.Console]::GenerateConsoleCtrlEvent(0, 0)) { exit 3 }
Start-Sleep -Milliseconds 500
exit 0
'@
    $file = Join-Path $bundle 'send-ctrl-c.ps1'
    Set-Content -Path $file -Value $helper -Encoding utf8
    $p = Start-Process -FilePath 'powershell.exe' -WindowStyle Hidden -Wait -PassThru `
        -ArgumentList @('-NoProfile', '-ExecutionPolicy', 'Bypass', '-File', $file, $ProcessId)
    Remove-Item -Path $file -ErrorAction SilentlyContinue
    return ($p.ExitCode -eq 0)
}

Write-Summary "dxdp field check $stamp on $($env:COMPUTERNAME)"
Write-Summary "bundle: $bundle"

# --- Versions ---------------------------------------------------------------------------------
$versions = Join-Path $bundle 'versions.txt'
$cv = Get-ItemProperty -Path 'HKLM:\SOFTWARE\Microsoft\Windows NT\CurrentVersion' -ErrorAction SilentlyContinue
$lines = @(
    "dxdp: $(& $Dxdp --version 2>&1)",
    "Windows: $($cv.ProductName) $($cv.DisplayVersion) build $($cv.CurrentBuild).$($cv.UBR)",
    "SystemDrive: $($env:SystemDrive)",
    "PowerShell: $($PSVersionTable.PSVersion)"
)
foreach ($tool in @('containerd', 'kubelet', 'kubectl', 'nvidia-smi')) {
    $cmd = Get-Command $tool -ErrorAction SilentlyContinue
    if ($null -eq $cmd) {
        $lines += "${tool}: not found"
        continue
    }
    $arguments = @('--version')
    if ($tool -eq 'kubectl') { $arguments = @('version', '--client') }
    if ($tool -eq 'nvidia-smi') { $arguments = @('--query-gpu=name,driver_version,pci.bus_id', '--format=csv') }
    $lines += "${tool}: $((& $cmd.Source @arguments 2>&1) -join ' | ')"
}
Set-Content -Path $versions -Value $lines -Encoding utf8
Write-Summary ("{0,-22} written" -f 'versions')

# --- The node tools -------------------------------------------------------------------------------
$snapshotFile = Join-Path $bundle 'snapshot.yaml'
Invoke-Logged -Name 'snapshot' -FilePath $Dxdp -Arguments @('snapshot', '-o', "`"$snapshotFile`"") | Out-Null
Invoke-Logged -Name 'discover' -FilePath $Dxdp -Arguments @('discover') | Out-Null
Invoke-Logged -Name 'discover-json' -FilePath $Dxdp -Arguments @('discover', '--json') | Out-Null
$dirArgs = @()
if ($KubeletDir -ne '') { $dirArgs = @('--kubelet-dir', "`"$KubeletDir`"") }
Invoke-Logged -Name 'doctor' -FilePath $Dxdp -Arguments (@('doctor') + $dirArgs) | Out-Null
Invoke-Logged -Name 'doctor-json' -FilePath $Dxdp -Arguments (@('doctor', '--json') + $dirArgs) | Out-Null
Invoke-Logged -Name 'hcs' -FilePath $Dxdp -Arguments @('hcs') | Out-Null
Invoke-Logged -Name 'hcs-json' -FilePath $Dxdp -Arguments @('hcs', '--json') | Out-Null

# --- The plugin against the real kubelet -----------------------------------------------------
$pluginDir = $KubeletDir
if ($pluginDir -eq '') { $pluginDir = Join-Path $env:SystemDrive 'var\lib\kubelet\device-plugins' }
$before = @(Get-ChildItem -Path $pluginDir -Filter 'dxdp-*.sock' -ErrorAction SilentlyContinue)
Get-ChildItem -Path $pluginDir -ErrorAction SilentlyContinue |
    Format-Table -Property @('Name', 'Length', 'LastWriteTime') -AutoSize | Out-File (Join-Path $bundle 'kubelet-dir-before.txt') -Encoding utf8

if ($PluginSeconds -le 0) {
    Write-Summary ("{0,-22} skipped (-PluginSeconds 0)" -f 'plugin')
} elseif ($before.Count -gt 0 -and -not $Force) {
    Write-Summary ("{0,-22} skipped: {1} dxdp socket(s) in {2} (a dxdp plugin may serve this node; -Force runs anyway: dxdp removes stale sockets and refuses to start next to a live plugin)" -f 'plugin', $before.Count, $pluginDir)
} else {
    $out = Join-Path $bundle 'plugin.stdout.txt'
    $err = Join-Path $bundle 'plugin.log'
    $env:DXDP_LOG_LEVEL = 'debug'
    $p = Start-Process -FilePath $Dxdp -ArgumentList (@('plugin') + $dirArgs) -WindowStyle Hidden -PassThru `
        -RedirectStandardOutput $out -RedirectStandardError $err
    Remove-Item Env:\DXDP_LOG_LEVEL
    Start-Sleep -Seconds $PluginSeconds
    $running = Get-ChildItem -Path $pluginDir -Filter 'dxdp-*.sock' -ErrorAction SilentlyContinue
    Write-Summary ("{0,-22} {1} socket(s) while running: {2}" -f 'plugin', @($running).Count, (@($running | ForEach-Object Name) -join ', '))
    if ($p.HasExited) {
        Write-Summary ("{0,-22} exited early with {1}: see plugin.log" -f 'plugin', $p.ExitCode)
    } else {
        $sent = Send-CtrlC -ProcessId $p.Id
        $graceful = $p.WaitForExit(10000)
        if (-not $graceful) {
            Stop-Process -Id $p.Id -Force -ErrorAction SilentlyContinue
        }
        $left = @(Get-ChildItem -Path $pluginDir -Filter 'dxdp-*.sock' -ErrorAction SilentlyContinue |
            Where-Object { $before.Name -notcontains $_.Name })
        Write-Summary ("{0,-22} Ctrl-C sent: {1}; stopped gracefully: {2}; sockets left behind: {3}" -f 'plugin-stop', $sent, $graceful, $left.Count)
    }
}
Get-ChildItem -Path $pluginDir -ErrorAction SilentlyContinue |
    Format-Table -Property @('Name', 'Length', 'LastWriteTime') -AutoSize | Out-File (Join-Path $bundle 'kubelet-dir-after.txt') -Encoding utf8

# --- The example Job ---------------------------------------------------------------------------
$kubectl = Get-Command 'kubectl' -ErrorAction SilentlyContinue
if ($JobManifest -eq '') {
    $JobManifest = Join-Path (Split-Path -Parent $PSScriptRoot) 'examples\device-discovery\display.yaml'
}
$manifest = ''
if (Test-Path $JobManifest) { $manifest = Get-Content -Raw -Path $JobManifest }
if ($JobImage -ne '') { $manifest = $manifest -replace '(?m)^(\s+image:\s*).*$', "`${1}$JobImage" }
$jobName = ''
if ($manifest -match '(?m)^metadata:\s*\r?\n\s+name:\s*(\S+)') { $jobName = $Matches[1] }
if ($SkipJob) {
    Write-Summary ("{0,-22} skipped (-SkipJob)" -f 'job')
} elseif ($null -eq $kubectl) {
    Write-Summary ("{0,-22} skipped: kubectl not found" -f 'job')
} elseif ($manifest -eq '' -or $jobName -eq '') {
    Write-Summary ("{0,-22} skipped: no Job in {1} (pass -JobManifest)" -f 'job', $JobManifest)
} elseif ($manifest -match 'image:\s*registry\.example\.com') {
    Write-Summary ("{0,-22} skipped: the manifest names the placeholder image; build examples/device-discovery/Dockerfile and pass -JobImage" -f 'job')
} else {
    $jobLog = Join-Path $bundle 'job.txt'
    $job = "job/$jobName"
    # Pin the Job to this node: the kubelet's node name is the lower-case computer name.
    $node = $env:COMPUTERNAME.ToLowerInvariant()
    $manifest = $manifest -replace '(?m)^(\s+)kubernetes\.io/os:\s*windows\s*$', "`${1}kubernetes.io/os: windows`n`${1}kubernetes.io/hostname: $node"
    Set-Content -Path (Join-Path $bundle 'job.yaml') -Value $manifest -Encoding utf8
    & $kubectl.Source 'delete' $job '--ignore-not-found' 2>&1 | Out-File $jobLog -Encoding utf8
    $manifest | & $kubectl.Source 'apply' '-f' '-' 2>&1 | Out-File $jobLog -Append -Encoding utf8
    & $kubectl.Source 'wait' '--for=condition=complete' '--timeout=300s' $job 2>&1 |
        Out-File $jobLog -Append -Encoding utf8
    $ok = ($LASTEXITCODE -eq 0)
    & $kubectl.Source 'describe' $job 2>&1 | Out-File $jobLog -Append -Encoding utf8
    & $kubectl.Source 'describe' 'pod' '-l' "job-name=$jobName" 2>&1 | Out-File $jobLog -Append -Encoding utf8
    & $kubectl.Source 'logs' $job 2>&1 | Out-File $jobLog -Append -Encoding utf8
    & $kubectl.Source 'delete' $job '--wait=false' 2>&1 | Out-File $jobLog -Append -Encoding utf8
    Write-Summary ("{0,-22} {1} completed: {2} (see job.txt)" -f 'job', $jobName, $ok)
}

# --- The bundle --------------------------------------------------------------------------------
$zip = "$bundle.zip"
Compress-Archive -Path (Join-Path $bundle '*') -DestinationPath $zip -Force
Write-Summary "bundle written: $zip"

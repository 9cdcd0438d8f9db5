<#
.SYNOPSIS
    dxdp field verification kit: collects one bundle from a real Windows GPU node to attach to a
    bug report.

.DESCRIPTION
    Checks that it runs elevated, finds dxdp.exe (-Dxdp, else beside this script, else on PATH,
    else in the dxdp image's location), records the versions of containerd and the kubelet from
    their Windows services (not PATH), then runs `dxdp snapshot`, `dxdp discover`, `dxdp doctor`
    and `dxdp hcs`; records what Windows itself says about the same devices with stock cmdlets
    and tools (Get-PnpDevice and Get-PnpDeviceProperty for every display and compute device, with
    the adapter LUID property and its type, location paths, driver key and INF, bus numbers,
    addresses and problem codes; the driver store folder of each device's driver package from
    SetupGetInfDriverStoreLocationW; pnputil /enum-drivers; a reg export of each adapter's driver
    key with its CopyToVm* values and their data; dxdiag /x where present; nvidia-smi where
    present); starts `dxdp plugin` against the node's real kubelet for a short time and stops it
    the way hcsshim stops a HostProcess container (CTRL_SHUTDOWN_EVENT through a
    kernel32!CtrlRoutine thread), timing the stop and checking that it removed its sockets and
    logged its stop line; when kubectl is available, runs the device-discovery example Job
    (examples/device-discovery/display.yaml) pinned to this node by its Kubernetes node name;
    and writes everything into one folder and one .zip.

    Nothing is installed, and no Windows setting, service, driver or registry value is changed;
    the bundle is written to -OutputDir. Two steps touch the node's Kubernetes state: the plugin
    step registers dxdp with the kubelet for -PluginSeconds (the node advertises the DirectX
    resources meanwhile, and shows them without allocatable devices after the stop until the
    kubelet drops them), and the Job step creates a Job in kubectl's current namespace, deletes
    it without waiting, and leaves the Job's image in the node's image store.
    -PluginSeconds 0 -SkipJob leaves only the bundle. If dxdp sockets are already in the kubelet
    directory (a dxdp DaemonSet serves this node, or a crashed run left them), the plugin step is
    skipped unless -Force is given.

    scripts/field-compare.py compares each dxdp fact in the bundle with what Windows said (the
    device nodes, the driver store folders, the CopyToVm* value data, and the assumption behind
    dxdp's match by PCI location) and prints the mismatches. docs/field-verification.md explains
    the procedure and docs/troubleshooting.md how to read the bundle. Works with Windows
    PowerShell 5.1 and PowerShell 7, and with spaces in every path.

.EXAMPLE
    .\field-check.ps1

.EXAMPLE
    .\field-check.ps1 -Dxdp C:\dxdp\dxdp.exe

.EXAMPLE
    .\field-check.ps1 -Dxdp .\dxdp.exe -PluginSeconds 0 -SkipJob
#>
[CmdletBinding()]
param(
    # The dxdp executable to test; empty: dxdp.exe beside this script, else on PATH, else where
    # the dxdp image puts it (%CONTAINER_SANDBOX_MOUNT_POINT%\dxdp.exe in the dxdp pod, C:\hpc).
    [string]$Dxdp = '',
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
    [switch]$Force,
    # The node's name in Kubernetes; empty: from NODE_NAME, the kubelet's --hostname-override,
    # or the Node object whose addresses are this host's (kubectl), else the computer name.
    [string]$NodeName = '',
    # How the plugin step stops dxdp: Shutdown (CTRL_SHUTDOWN_EVENT, as hcsshim) or CtrlC.
    [ValidateSet('Shutdown', 'CtrlC')]
    [string]$StopEvent = 'Shutdown'
)

# No strict mode: a field check should record what it can and go on, never stop half-way.
$ErrorActionPreference = 'Continue'

# Elevation first: the plugin step, the driver keys and pnputil need an administrator.
$identity = [Security.Principal.WindowsIdentity]::GetCurrent()
$principal = New-Object Security.Principal.WindowsPrincipal($identity)
if (-not $principal.IsInRole([Security.Principal.WindowsBuiltInRole]::Administrator)) {
    Write-Error 'field-check.ps1 needs an elevated PowerShell (Run as administrator): the plugin step creates sockets in the kubelet directory and the ground truth reads driver keys.'
    exit 2
}

# The dxdp under test, and where it was found.
function Resolve-Dxdp {
    if ($Dxdp -ne '') {
        $named = Get-Command $Dxdp -CommandType Application -ErrorAction SilentlyContinue | Select-Object -First 1
        if ($null -ne $named) { return @($named.Source, '-Dxdp') }
        return @($null, "-Dxdp $Dxdp does not exist")
    }
    $beside = Join-Path $PSScriptRoot 'dxdp.exe'
    if (Test-Path -LiteralPath $beside -PathType Leaf) { return @($beside, 'beside the script') }
    $onPath = Get-Command 'dxdp.exe' -CommandType Application -ErrorAction SilentlyContinue | Select-Object -First 1
    if ($null -ne $onPath) { return @($onPath.Source, 'PATH') }
    foreach ($root in @($env:CONTAINER_SANDBOX_MOUNT_POINT, 'C:\hpc')) {
        if (-not $root) { continue }
        $inImage = Join-Path $root 'dxdp.exe'
        if (Test-Path -LiteralPath $inImage -PathType Leaf) { return @($inImage, "the image's location ($root)") }
    }
    return @($null, 'no dxdp.exe beside the script, on PATH, under %CONTAINER_SANDBOX_MOUNT_POINT% or in C:\hpc')
}
$dxdpInfo = Resolve-Dxdp
if ($null -eq $dxdpInfo[0]) {
    Write-Error "field-check.ps1 cannot find dxdp.exe: $($dxdpInfo[1]). Pass -Dxdp C:\path\to\dxdp.exe."
    exit 2
}
$Dxdp = $dxdpInfo[0]

# The executable of a Windows service, from its command line (Win32_Service PathName, quoted or
# not); through nssm, the program nssm runs (the service's Parameters\Application).
function Get-ServiceExecutable {
    param([string]$Name)
    $service = Get-CimInstance -ClassName Win32_Service -Filter "Name='$Name'" -ErrorAction SilentlyContinue
    if ($null -eq $service -or -not $service.PathName) { return $null }
    $line = $service.PathName.Trim()
    $exe = ($line -split '\s+')[0]
    if ($line -match '^"([^"]+)"') {
        $exe = $Matches[1]
    } elseif ($line -match '^(.+?\.exe)(\s|$)') {
        $exe = $Matches[1]
    }
    if ((Split-Path -Leaf $exe) -ieq 'nssm.exe') {
        $parameters = "HKLM:\SYSTEM\CurrentControlSet\Services\$Name\Parameters"
        $application = (Get-ItemProperty -LiteralPath $parameters -Name 'Application' -ErrorAction SilentlyContinue).Application
        if ($application) { $exe = $application }
    }
    return [ordered]@{ path = $exe; state = [string]$service.State; commandLine = $line }
}

$stamp = Get-Date -Format 'yyyyMMdd-HHmmss'
$OutputDir = (Resolve-Path -LiteralPath $OutputDir).Path
$bundle = Join-Path $OutputDir "dxdp-field-$($env:COMPUTERNAME)-$stamp"
New-Item -ItemType Directory -Path $bundle -Force | Out-Null
$summary = Join-Path $bundle 'summary.txt'

# One command-line argument, quoted when it has a space or a quote (Start-Process joins
# -ArgumentList with spaces and quotes nothing, in PowerShell 5.1 and 7 alike).
function ConvertTo-Argument {
    param([string]$Value)
    if ($Value -eq '') { return '""' }
    if ($Value -notmatch '[\s"]') { return $Value }
    # Backslashes before a quote, and at the end, are doubled (CommandLineToArgvW rules).
    $escaped = $Value -replace '(\\*)"', '$1$1\"'
    $escaped = $escaped -replace '(\\+)$', '$1$1'
    return '"' + $escaped + '"'
}

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
        $quoted = @($Arguments | ForEach-Object { ConvertTo-Argument $_ })
        $p = Start-Process -FilePath $FilePath -ArgumentList $quoted -NoNewWindow -PassThru `
            -RedirectStandardOutput $out -RedirectStandardError $err
        # Reading Handle now keeps the exit code readable on Windows PowerShell 5.1.
        $null = $p.Handle
        $p.WaitForExit()
        Write-Summary ("{0,-22} exit {1}" -f $Name, $p.ExitCode)
        return $p.ExitCode
    } catch {
        Write-Summary ("{0,-22} could not run: {1}" -f $Name, $_.Exception.Message)
        return -1
    }
}

# Stops a process the way hcsshim stops a HostProcess container (internal/jobcontainers in
# microsoft/hcsshim): a thread in the target process at kernel32!CtrlRoutine with the console
# event as its parameter (0 CTRL_C_EVENT, 6 CTRL_SHUTDOWN_EVENT). Returns whether it was sent.
Add-Type -Namespace DxdpFieldCheck -Name Signal -MemberDefinition @'
[DllImport("kernel32.dll", SetLastError=true)] public static extern System.IntPtr OpenProcess(uint access, bool inherit, uint pid);
[DllImport("kernel32.dll", SetLastError=true, CharSet=CharSet.Unicode)] public static extern System.IntPtr GetModuleHandleW(string name);
[DllImport("kernel32.dll", SetLastError=true, CharSet=CharSet.Ansi)] public static extern System.IntPtr GetProcAddress(System.IntPtr module, string name);
[DllImport("kernel32.dll", SetLastError=true)] public static extern System.IntPtr CreateRemoteThread(System.IntPtr process, System.IntPtr attributes, System.UIntPtr stack, System.IntPtr start, System.IntPtr parameter, uint flags, System.IntPtr id);
[DllImport("kernel32.dll", SetLastError=true)] public static extern bool CloseHandle(System.IntPtr handle);
'@
function Send-ConsoleEvent {
    param([int]$ProcessId, [int]$ConsoleEvent)
    $process = [DxdpFieldCheck.Signal]::OpenProcess(0x1F0FFF, $false, [uint32]$ProcessId)
    if ($process -eq [System.IntPtr]::Zero) { return $false }
    try {
        $kernel32 = [DxdpFieldCheck.Signal]::GetModuleHandleW('kernel32.dll')
        $routine = [DxdpFieldCheck.Signal]::GetProcAddress($kernel32, 'CtrlRoutine')
        if ($routine -eq [System.IntPtr]::Zero) { return $false }
        $thread = [DxdpFieldCheck.Signal]::CreateRemoteThread($process, [System.IntPtr]::Zero, [System.UIntPtr]::Zero, $routine, [System.IntPtr]$ConsoleEvent, 0, [System.IntPtr]::Zero)
        if ($thread -eq [System.IntPtr]::Zero) { return $false }
        [DxdpFieldCheck.Signal]::CloseHandle($thread) | Out-Null
        return $true
    } finally {
        [DxdpFieldCheck.Signal]::CloseHandle($process) | Out-Null
    }
}

# The node's name in Kubernetes, and where it came from. The kubelet registers the Node under
# --hostname-override when given (EKS and others set it), so the computer name is the last guess.
function Get-NodeName {
    if ($NodeName -ne '') { return @($NodeName, '-NodeName') }
    if ($env:NODE_NAME) { return @($env:NODE_NAME, 'NODE_NAME') }
    $kubelet = Get-CimInstance -ClassName Win32_Process -Filter "Name='kubelet.exe'" -ErrorAction SilentlyContinue |
        Select-Object -First 1
    if ($null -ne $kubelet -and $kubelet.CommandLine -match '--hostname-override[= ]+"?([^"\s]+)') {
        return @($Matches[1], 'the kubelet --hostname-override')
    }
    $kubectl = Get-Command 'kubectl' -ErrorAction SilentlyContinue
    if ($null -ne $kubectl) {
        $addresses = @(Get-NetIPAddress -ErrorAction SilentlyContinue | ForEach-Object { $_.IPAddress })
        $json = (& $kubectl.Source 'get' 'nodes' '-o' 'json' 2>$null) -join "`n"
        if ($LASTEXITCODE -eq 0 -and $json -ne '') {
            $nodes = ($json | ConvertFrom-Json).items
            foreach ($node in $nodes) {
                foreach ($address in $node.status.addresses) {
                    if ($address.type -eq 'InternalIP' -and $addresses -contains $address.address) {
                        return @($node.metadata.name, "the Node whose InternalIP $($address.address) is this host's")
                    }
                }
            }
        }
    }
    return @($env:COMPUTERNAME.ToLowerInvariant(), 'the computer name (no NODE_NAME, --hostname-override or matching Node found)')
}

Write-Summary "dxdp field check $stamp on $($env:COMPUTERNAME)"
Write-Summary "bundle: $bundle"
$nodeInfo = Get-NodeName
$node = $nodeInfo[0]
Write-Summary ("{0,-22} {1} (from {2})" -f 'node name', $node, $nodeInfo[1])
Write-Summary ("{0,-22} {1} (found {2})" -f 'dxdp', $Dxdp, $dxdpInfo[1])

# --- Versions ---------------------------------------------------------------------------------
$versions = Join-Path $bundle 'versions.txt'
$cv = Get-ItemProperty -Path 'HKLM:\SOFTWARE\Microsoft\Windows NT\CurrentVersion' -ErrorAction SilentlyContinue
$lines = @(
    "dxdp: $(& $Dxdp --version 2>&1) ($Dxdp, found $($dxdpInfo[1]))",
    "Windows: $($cv.ProductName) $($cv.DisplayVersion) build $($cv.CurrentBuild).$($cv.UBR)",
    "SystemDrive: $($env:SystemDrive)",
    "PowerShell: $($PSVersionTable.PSVersion) $($PSVersionTable.PSEdition)",
    "Node name: $node (from $($nodeInfo[1]))"
)
# containerd and the kubelet as the node runs them: the programs of their Windows services.
foreach ($service in @('containerd', 'kubelet')) {
    $program = Get-ServiceExecutable -Name $service
    if ($null -eq $program) {
        $lines += "${service}: no Windows service named $service"
        continue
    }
    $version = 'cannot run it'
    if (Test-Path -LiteralPath $program.path -PathType Leaf) {
        $version = (& $program.path '--version' 2>&1) -join ' | '
    }
    $lines += "${service}: $version (service $service, $($program.state): $($program.path))"
    $lines += "${service} service command line: $($program.commandLine)"
}
foreach ($tool in @('kubectl', 'nvidia-smi')) {
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
Invoke-Logged -Name 'snapshot' -FilePath $Dxdp -Arguments @('snapshot', '-o', $snapshotFile) | Out-Null
Invoke-Logged -Name 'snapshot-json' -FilePath $Dxdp -Arguments @('snapshot', '--format', 'json', '-o', (Join-Path $bundle 'snapshot.json')) | Out-Null
Invoke-Logged -Name 'discover' -FilePath $Dxdp -Arguments @('discover') | Out-Null
Invoke-Logged -Name 'discover-json' -FilePath $Dxdp -Arguments @('discover', '--json') | Out-Null
$dirArgs = @()
if ($KubeletDir -ne '') { $dirArgs = @('--kubelet-dir', $KubeletDir) }
Invoke-Logged -Name 'doctor' -FilePath $Dxdp -Arguments (@('doctor') + $dirArgs) | Out-Null
Invoke-Logged -Name 'doctor-json' -FilePath $Dxdp -Arguments (@('doctor', '--json') + $dirArgs) | Out-Null
Invoke-Logged -Name 'hcs' -FilePath $Dxdp -Arguments @('hcs') | Out-Null
Invoke-Logged -Name 'hcs-json' -FilePath $Dxdp -Arguments @('hcs', '--json') | Out-Null

# --- What Windows itself says (ground truth, without dxdp) ---------------------------------
# Every display and compute device, with the properties dxdp reads: scripts/field-compare.py
# compares them with dxdp's snapshot and discovery. The LUID property keeps its type, since a
# driver that stores it with another type is what dxdp's second match (by PCI location) is for.
$truthDir = Join-Path $bundle 'ground-truth'
New-Item -ItemType Directory -Path $truthDir -Force | Out-Null
$keys = @(
    'DEVPKEY_Device_DeviceDesc', 'DEVPKEY_Device_Manufacturer', 'DEVPKEY_Device_LocationPaths',
    'DEVPKEY_Device_Driver', 'DEVPKEY_Device_DriverInfPath', 'DEVPKEY_Device_BusNumber', 'DEVPKEY_Device_Address',
    'DEVPKEY_Device_ProblemCode', 'DEVPKEY_Device_DevNodeStatus',
    '{60B193CB-5276-4D0F-96FC-F173ABAD3EC6} 2'
)
$devices = @()
$pnp = @(Get-PnpDevice -PresentOnly -ErrorAction SilentlyContinue |
    Where-Object { $_.Class -eq 'Display' -or $_.Class -eq 'ComputeAccelerator' })
foreach ($device in $pnp) {
    $properties = @{}
    foreach ($key in $keys) {
        $property = Get-PnpDeviceProperty -InstanceId $device.InstanceId -KeyName $key -ErrorAction SilentlyContinue
        if ($null -ne $property -and $property.Type -ne 'Empty') {
            $properties[$key] = [ordered]@{ type = [string]$property.Type; data = $property.Data }
        }
    }
    $devices += [ordered]@{
        instanceId = $device.InstanceId
        class = $device.Class
        friendlyName = $device.FriendlyName
        status = [string]$device.Status
        problem = [string]$device.Problem
        configManagerErrorCode = [string]$device.ConfigManagerErrorCode
        properties = $properties
    }
}
ConvertTo-Json -InputObject @($devices) -Depth 6 | Set-Content -LiteralPath (Join-Path $truthDir 'pnp-devices.json') -Encoding utf8
$pnp | Format-List -Property * | Out-File -LiteralPath (Join-Path $truthDir 'pnp-devices.txt') -Encoding utf8
Write-Summary ("{0,-22} {1} display/compute device(s) from Get-PnpDevice" -f 'ground truth', $devices.Count)

# The driver store folder of each device's driver package, as Windows reports it for the INF
# the device was installed from (SetupGetInfDriverStoreLocationW, setupapi.dll).
Add-Type -Namespace DxdpFieldCheck -Name Setup -MemberDefinition @'
[DllImport("setupapi.dll", SetLastError=true, CharSet=CharSet.Unicode)] public static extern bool SetupGetInfDriverStoreLocationW(string fileName, System.IntPtr platform, string localeName, System.Text.StringBuilder buffer, uint bufferSize, out uint requiredSize);
'@
$packages = @()
foreach ($device in $devices) {
    $entry = [ordered]@{ instanceId = $device.instanceId; infPath = $null; driverStoreInf = $null; error = $null }
    $inf = $device.properties['DEVPKEY_Device_DriverInfPath']
    if ($null -eq $inf) {
        $entry.error = 'the device node has no DEVPKEY_Device_DriverInfPath'
    } else {
        $entry.infPath = [string]$inf.data
        $buffer = New-Object System.Text.StringBuilder 2048
        $needed = [uint32]0
        $infFile = Join-Path $env:windir "INF\$($entry.infPath)"
        if ([DxdpFieldCheck.Setup]::SetupGetInfDriverStoreLocationW($infFile, [System.IntPtr]::Zero, $null, $buffer, [uint32]$buffer.Capacity, [ref]$needed)) {
            $entry.driverStoreInf = $buffer.ToString()
        } else {
            $entry.error = "SetupGetInfDriverStoreLocationW($infFile) failed: Win32 error $([System.Runtime.InteropServices.Marshal]::GetLastWin32Error())"
        }
    }
    $packages += $entry
}
ConvertTo-Json -InputObject @($packages) -Depth 4 | Set-Content -LiteralPath (Join-Path $truthDir 'driver-packages.json') -Encoding utf8
Write-Summary ("{0,-22} {1} driver package(s) located" -f 'driver store', @($packages | Where-Object { $_.driverStoreInf }).Count)

# The driver key of each device, exported as Windows has it (CopyToVm* subkeys and data included).
foreach ($device in $devices) {
    $driver = $device.properties['DEVPKEY_Device_Driver']
    if ($null -eq $driver) { continue }
    $key = "HKLM\SYSTEM\CurrentControlSet\Control\Class\$($driver.data)"
    $file = Join-Path $truthDir ("driver-key-" + ($driver.data -replace '[^0-9A-Za-z]+', '-') + '.reg')
    $exported = Start-Process -FilePath 'reg.exe' -ArgumentList @('export', (ConvertTo-Argument $key), (ConvertTo-Argument $file), '/y') `
        -NoNewWindow -Wait -PassThru
    Write-Summary ("{0,-22} {1}: exit {2}" -f 'reg export', $driver.data, $exported.ExitCode)
}

# The driver packages, the OS's own DirectX report, and the NVIDIA tool's view where present.
Invoke-Logged -Name 'ground-truth\pnputil-drivers' -FilePath 'pnputil.exe' -Arguments @('/enum-drivers') | Out-Null
$dxdiag = Get-Command 'dxdiag.exe' -ErrorAction SilentlyContinue
if ($null -eq $dxdiag) {
    Write-Summary ("{0,-22} skipped: dxdiag.exe not found" -f 'dxdiag')
} else {
    $dxdiagFile = Join-Path $truthDir 'dxdiag.xml'
    $d = Start-Process -FilePath $dxdiag.Source -ArgumentList @('/whql:off', '/x', (ConvertTo-Argument $dxdiagFile)) -PassThru
    $null = $d.Handle
    if (-not $d.WaitForExit(120000)) {
        Stop-Process -Id $d.Id -Force -ErrorAction SilentlyContinue
        Write-Summary ("{0,-22} did not finish within 120 s" -f 'dxdiag')
    } else {
        Write-Summary ("{0,-22} exit {1}, written: {2}" -f 'dxdiag', $d.ExitCode, (Test-Path -LiteralPath $dxdiagFile))
    }
}
$smi = Get-Command 'nvidia-smi' -ErrorAction SilentlyContinue
if ($null -ne $smi) {
    Invoke-Logged -Name 'ground-truth\nvidia-smi' -FilePath $smi.Source `
        -Arguments @('--query-gpu=name,pci.bus_id,driver_version,memory.total', '--format=csv') | Out-Null
}

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
    $quoted = @((@('plugin') + $dirArgs) | ForEach-Object { ConvertTo-Argument $_ })
    $p = Start-Process -FilePath $Dxdp -ArgumentList $quoted -WindowStyle Hidden -PassThru `
        -RedirectStandardOutput $out -RedirectStandardError $err
    # Reading Handle now keeps ExitCode readable after the exit on Windows PowerShell 5.1.
    $null = $p.Handle
    Remove-Item Env:\DXDP_LOG_LEVEL
    Start-Sleep -Seconds $PluginSeconds
    $running = Get-ChildItem -Path $pluginDir -Filter 'dxdp-*.sock' -ErrorAction SilentlyContinue
    Write-Summary ("{0,-22} {1} socket(s) while running: {2}" -f 'plugin', @($running).Count, (@($running | ForEach-Object Name) -join ', '))
    if ($p.HasExited) {
        Write-Summary ("{0,-22} exited early with {1}: see plugin.log" -f 'plugin', $p.ExitCode)
    } else {
        $code = 6
        $name = 'CTRL_SHUTDOWN_EVENT (as hcsshim)'
        if ($StopEvent -eq 'CtrlC') { $code = 0; $name = 'CTRL_C_EVENT' }
        $clock = [System.Diagnostics.Stopwatch]::StartNew()
        $sent = Send-ConsoleEvent -ProcessId $p.Id -ConsoleEvent $code
        # hcsshim terminates the job 5 s after the event; wait 10 s to see how long it really takes.
        $graceful = $p.WaitForExit(10000)
        $clock.Stop()
        if (-not $graceful) {
            Stop-Process -Id $p.Id -Force -ErrorAction SilentlyContinue
        }
        $left = @(Get-ChildItem -Path $pluginDir -Filter 'dxdp-*.sock' -ErrorAction SilentlyContinue |
            Where-Object { $before.Name -notcontains $_.Name })
        $lastLine = Get-Content -LiteralPath $err -ErrorAction SilentlyContinue |
            Where-Object { $_.Trim() -ne '' } | Select-Object -Last 1
        $stopLine = ($null -ne $lastLine -and $lastLine -match 'device plugin stopped')
        $within = $graceful -and $clock.Elapsed.TotalSeconds -lt 5
        Write-Summary ("{0,-22} {1} sent: {2}; exited after {3:N2} s: {4}; within hcsshim's 5 s: {5}; sockets left behind: {6}; log ends with the stop line: {7}" -f `
            'plugin-stop', $name, $sent, $clock.Elapsed.TotalSeconds, $graceful, $within, $left.Count, $stopLine)
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
    # Pin the Job to this node by its Kubernetes node name (found above, not the computer name).
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
# The command that runs on this node: Windows has no python3 command (python.org's installer
# brings the py launcher and python.exe).
Write-Summary ('compare with (Python 3.8+): py -3 "{0}" "{1}"  (or python instead of py -3; python3 on Linux and macOS)' -f `
    (Join-Path $PSScriptRoot 'field-compare.py'), $zip)
Compress-Archive -Path (Join-Path $bundle '*') -DestinationPath $zip -Force
Write-Summary "bundle written: $zip"

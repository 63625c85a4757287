// Command pulumi-language-python runs Pulumi programs and policy packs written in Python for the Pulumi CLI.
//
// Pulumi's own host lives in a module the Go module proxy reachable here does not serve. This one answers the
// calls the CLI makes for `preview`, `up`, `destroy`, `refresh`, `about`, `install` and `--policy-pack`, and leaves
// code generation (convert, import, package gen) unimplemented. It runs the program through the SDK's own
// pulumi-language-python-exec script (installed beside it) in the project's virtual environment, resolved by the
// SDK's Python toolchain support (pip, uv or poetry), and a policy pack through the SDK's policy proxy, which
// hands the pack the stack's configuration.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	sdk "github.com/pulumi/pulumi/sdk/v3"
	"github.com/pulumi/pulumi/sdk/v3/go/common/apitype"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/cmdutil"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/logging"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	"github.com/pulumi/pulumi/sdk/v3/go/common/version"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"github.com/pulumi/pulumi/sdk/v3/python/toolchain"
)

const (
	execScript = "pulumi-language-python-exec"
	// bailExitCode is how the exec script says it has already shown the user an actionable error.
	bailExitCode = 32
	// healthTimeout is how long the host outlives an engine that stopped answering.
	healthTimeout = 5 * time.Minute
)

// pluginJSONScript prints, for every installed distribution that ships a pulumi-plugin.json (a Pulumi package),
// its name, version and that file's contents; packages named pulumi-* without one are listed with no plugin data.
const pluginJSONScript = `import importlib.metadata as md, json
found = []
for dist in md.distributions():
    name = dist.metadata["Name"] or ""
    plugin = None
    for path in dist.files or []:
        if path.name == "pulumi-plugin.json":
            plugin = json.loads(path.read_text())
            break
    if plugin is not None or name.lower().startswith("pulumi-"):
        found.append({"name": name, "version": dist.version, "plugin": plugin})
print(json.dumps(found))
`

type host struct {
	pulumirpc.UnimplementedLanguageRuntimeServer

	exec string

	mu      sync.Mutex
	engine  string
	stopAll context.Context
	stop    context.CancelFunc
}

func main() {
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.String("tracing", "", "accepted for the CLI's sake; this host emits no traces")
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Version)
		return
	}
	logging.InitLogging(false, 0, false)

	self, err := os.Executable()
	if err != nil {
		cmdutil.Exit(fmt.Errorf("could not find this executable: %w", err))
	}
	script := filepath.Join(filepath.Dir(self), execScript)
	if _, err := os.Stat(script); err != nil {
		cmdutil.Exit(fmt.Errorf("%s must be installed beside the language host: %w", execScript, err))
	}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	defer cancel()
	stopServing := make(chan bool)
	go func() {
		<-ctx.Done()
		close(stopServing)
	}()

	stopAll, stop := context.WithCancel(context.Background())
	h := &host{exec: script, stopAll: stopAll, stop: stop}
	if args := flag.Args(); len(args) > 0 {
		h.engine = args[0]
		if err := rpcutil.Healthcheck(ctx, h.engine, healthTimeout, cancel); err != nil {
			cmdutil.Exit(fmt.Errorf("could not watch the engine: %w", err))
		}
	}

	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Cancel: stopServing,
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(srv, h)
			return nil
		},
	})
	if err != nil {
		cmdutil.Exit(fmt.Errorf("could not start the language host: %w", err))
	}
	fmt.Printf("%d\n", handle.Port) // the CLI reads the port from the first line
	if err := <-handle.Done; err != nil {
		cmdutil.Exit(fmt.Errorf("language host stopped serving: %w", err))
	}
}

func (h *host) engineAddress() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.engine
}

// Handshake is how a CLI that starts hosts without arguments tells this one where the engine is.
func (h *host) Handshake(ctx context.Context, req *pulumirpc.LanguageHandshakeRequest,
) (*pulumirpc.LanguageHandshakeResponse, error) {
	h.mu.Lock()
	h.engine = req.EngineAddress
	h.mu.Unlock()
	watch, cancel := context.WithCancel(context.Background())
	if err := rpcutil.Healthcheck(watch, req.EngineAddress, healthTimeout, cancel); err != nil {
		cancel()
		return nil, fmt.Errorf("could not watch the engine: %w", err)
	}
	return &pulumirpc.LanguageHandshakeResponse{}, nil
}

func (h *host) GetPluginInfo(context.Context, *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: version.Version}, nil
}

func (h *host) Cancel(context.Context, *emptypb.Empty) (*emptypb.Empty, error) {
	h.stop()
	return &emptypb.Empty{}, nil
}

// pythonOptions reads the project's runtime options (Pulumi.yaml `runtime.options`) the way the CLI documents
// them: toolchain pip|uv|poetry, virtualenv relative to the project root.
func pythonOptions(info *pulumirpc.ProgramInfo, isPlugin bool) (toolchain.PythonOptions, error) {
	opts := toolchain.PythonOptions{Root: info.RootDirectory, ProgramDir: info.ProgramDirectory}
	given := info.GetOptions().AsMap()
	if v, ok := given["virtualenv"]; ok {
		text, isText := v.(string)
		if !isText {
			return opts, errors.New("runtime option virtualenv must be a string")
		}
		opts.Virtualenv = text
	}
	if v, ok := given["toolchain"]; ok {
		switch v {
		case "pip":
			opts.Toolchain = toolchain.Pip
		case "uv":
			opts.Toolchain = toolchain.Uv
		case "poetry":
			opts.Toolchain = toolchain.Poetry
		default:
			return opts, fmt.Errorf("runtime option toolchain %v is not one of pip, uv, poetry", v)
		}
	}
	if v, ok := given["typechecker"]; ok && v != "" {
		return opts, fmt.Errorf("runtime option typechecker %v is not supported by this language host", v)
	}
	if isPlugin && opts.Virtualenv == "" && (opts.Toolchain == toolchain.Pip || opts.Toolchain == toolchain.Auto) {
		opts.Virtualenv = "venv" // plugins never run in the ambient Python
	}
	return opts, nil
}

func resolve(info *pulumirpc.ProgramInfo, isPlugin bool) (toolchain.Toolchain, error) {
	opts, err := pythonOptions(info, isPlugin)
	if err != nil {
		return nil, err
	}
	return toolchain.ResolveToolchain(opts)
}

type installedPackage struct {
	Name    string          `json:"name"`
	Version string          `json:"version"`
	Plugin  json.RawMessage `json:"plugin"`
}

type pluginJSON struct {
	Resource bool   `json:"resource"`
	Name     string `json:"name"`
	Version  string `json:"version"`
	Server   string `json:"server"`
}

// GetRequiredPackages lists the resource plugins of the Pulumi packages installed in the program's environment,
// so the engine knows each default provider's version.
func (h *host) GetRequiredPackages(ctx context.Context, req *pulumirpc.GetRequiredPackagesRequest,
) (*pulumirpc.GetRequiredPackagesResponse, error) {
	tc, err := resolve(req.Info, false)
	if err != nil {
		return nil, err
	}
	if err := tc.ValidateVenv(ctx); err != nil {
		return nil, err
	}
	cmd, err := tc.Command(ctx, "-c", pluginJSONScript)
	if err != nil {
		return nil, err
	}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("listing the program's Pulumi packages: %w", err)
	}
	var installed []installedPackage
	if err := json.Unmarshal(out, &installed); err != nil {
		return nil, fmt.Errorf("reading the program's Pulumi packages: %w", err)
	}
	var packages []*pulumirpc.PackageDependency
	for _, pkg := range installed {
		meta := pluginJSON{Resource: true}
		if len(pkg.Plugin) > 0 && string(pkg.Plugin) != "null" {
			if err := json.Unmarshal(pkg.Plugin, &meta); err != nil {
				return nil, fmt.Errorf("pulumi-plugin.json of %s: %w", pkg.Name, err)
			}
		}
		if !meta.Resource || strings.EqualFold(pkg.Name, "pulumi") || strings.EqualFold(pkg.Name, "pulumi-policy") {
			continue
		}
		name := meta.Name
		if name == "" {
			name = strings.TrimPrefix(strings.ToLower(pkg.Name), "pulumi-")
		}
		pluginVersion := meta.Version
		if pluginVersion == "" {
			pluginVersion = pkg.Version
			if strings.ContainsAny(pluginVersion, "abr+") { // a pre-release's plugin version cannot be derived
				continue
			}
		}
		if !strings.HasPrefix(pluginVersion, "v") {
			pluginVersion = "v" + pluginVersion
		}
		packages = append(packages, &pulumirpc.PackageDependency{
			Name: name, Version: pluginVersion, Kind: string(apitype.ResourcePlugin), Server: meta.Server,
		})
	}
	return &pulumirpc.GetRequiredPackagesResponse{Packages: packages}, nil
}

// Run runs the program through the exec script, with the stack's configuration in the environment.
func (h *host) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	engine := h.engineAddress()
	if engine == "" {
		return nil, errors.New("the language host was given no engine address")
	}
	tc, err := resolve(req.Info, false)
	if err != nil {
		return nil, err
	}
	if err := tc.ValidateVenv(ctx); err != nil {
		return nil, err
	}
	args := []string{h.exec}
	flagged := func(name, value string) {
		if value != "" {
			args = append(args, "--"+name, value)
		}
	}
	flagged("monitor", req.GetMonitorAddress())
	flagged("engine", engine)
	flagged("project", req.GetProject())
	flagged("root_directory", req.GetInfo().GetRootDirectory())
	flagged("stack", req.GetStack())
	flagged("pwd", req.GetPwd())
	flagged("dry_run", strconv.FormatBool(req.GetDryRun()))
	flagged("parallel", strconv.Itoa(int(req.GetParallel())))
	flagged("organization", req.GetOrganization())
	args = append(args, req.GetInfo().GetEntryPoint())
	args = append(args, req.GetArgs()...)

	config, err := json.Marshal(req.GetConfig())
	if err != nil {
		return nil, err
	}
	secretKeys := req.GetConfigSecretKeys()
	if secretKeys == nil {
		secretKeys = []string{}
	}
	secrets, err := json.Marshal(secretKeys)
	if err != nil {
		return nil, err
	}

	runCtx, cancel := context.WithCancel(h.stopAll)
	defer cancel()
	context.AfterFunc(ctx, cancel)
	cmd, err := tc.Command(runCtx, args...)
	if err != nil {
		return nil, err
	}
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, "PULUMI_CONFIG="+string(config), "PULUMI_CONFIG_SECRET_KEYS="+string(secrets))

	if err := cmd.Run(); err != nil {
		_ = os.Stdout.Sync()
		_ = os.Stderr.Sync()
		var exited *exec.ExitError
		if errors.As(err, &exited) {
			if exited.ExitCode() == bailExitCode {
				return &pulumirpc.RunResponse{Bail: true}, nil
			}
			return &pulumirpc.RunResponse{Error: fmt.Sprintf("program exited with non-zero exit code: %d",
				exited.ExitCode())}, nil
		}
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("could not run the Python program: %v", err)}, nil
	}
	return &pulumirpc.RunResponse{}, nil
}

// RunPlugin runs a policy pack (`python -u -m pulumi.policy <engine> <pack dir>`, in the pack's directory, with
// the stack's configuration handed over through the SDK's policy proxy) or a plugin's __main__.py.
func (h *host) RunPlugin(req *pulumirpc.RunPluginRequest, server pulumirpc.LanguageRuntime_RunPluginServer) error {
	ctx := server.Context()
	analyzer := req.Kind == string(apitype.AnalyzerPlugin)
	tc, err := resolve(req.Info, !analyzer)
	if err != nil {
		return err
	}
	var args []string
	if analyzer {
		args = append([]string{"-u", "-m", "pulumi.policy"}, req.Args...)
		args = append(args, req.Info.ProgramDirectory)
	} else {
		args = append([]string{req.Info.ProgramDirectory}, req.Args...)
	}
	cmd, err := tc.Command(ctx, args...)
	if err != nil {
		return err
	}
	closer, stdout, stderr, err := rpcutil.MakeRunPluginStreams(server, false)
	if err != nil {
		return err
	}
	defer closer.Close()
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}

	var proxy *sdk.PolicyProxy
	if analyzer {
		cmd.Dir = req.Info.ProgramDirectory
		proxy, stdout, err = sdk.NewPolicyProxy(ctx, stdout)
		if err != nil {
			return fmt.Errorf("could not start the policy proxy: %w", err)
		}
		stack, err := proxy.AwaitConfiguration(ctx)
		if err != nil {
			return fmt.Errorf("could not read the stack's configuration: %w", err)
		}
		if stack != nil {
			config, err := json.Marshal(stack.Config)
			if err != nil {
				return err
			}
			for key, value := range map[string]string{
				"PULUMI_ORGANIZATION": stack.Organization, "PULUMI_PROJECT": stack.Project,
				"PULUMI_STACK": stack.Stack, "PULUMI_DRY_RUN": strconv.FormatBool(stack.DryRun),
				"PULUMI_CONFIG": string(config),
			} {
				if value != "" {
					cmd.Env = append(cmd.Env, key+"="+value)
				}
			}
		}
	} else {
		cmd.Dir = req.Pwd
	}
	cmd.Env = append(cmd.Env, req.Env...)
	cmd.Stdout, cmd.Stderr = stdout, stderr

	if err := cmd.Start(); err != nil {
		return fmt.Errorf("could not start the plugin: %w", err)
	}
	if proxy != nil {
		if err := proxy.Attach(ctx, cmd); err != nil {
			return fmt.Errorf("could not attach to the policy pack: %w", err)
		}
		return closer.Close()
	}
	if err := cmd.Wait(); err != nil {
		var exited *exec.ExitError
		if errors.As(err, &exited) {
			if waited, ok := exited.Sys().(syscall.WaitStatus); ok {
				return server.Send(&pulumirpc.RunPluginResponse{
					Output: &pulumirpc.RunPluginResponse_Exitcode{Exitcode: int32(waited.ExitStatus())},
				})
			}
		}
		return fmt.Errorf("plugin failed: %w", err)
	}
	return closer.Close()
}

// InstallDependencies creates the virtual environment and installs the project into it (`pulumi install`).
func (h *host) InstallDependencies(req *pulumirpc.InstallDependenciesRequest,
	server pulumirpc.LanguageRuntime_InstallDependenciesServer,
) error {
	tc, err := resolve(req.Info, req.IsPlugin)
	if err != nil {
		return err
	}
	closer, stdout, stderr, err := rpcutil.MakeInstallDependenciesStreams(server, req.IsTerminal)
	if err != nil {
		return err
	}
	defer closer.Close()
	if err := tc.InstallDependencies(server.Context(), req.Info.ProgramDirectory, req.UseLanguageVersionTools,
		true, stdout, stderr); err != nil {
		return err
	}
	return closer.Close()
}

func (h *host) About(ctx context.Context, req *pulumirpc.AboutRequest) (*pulumirpc.AboutResponse, error) {
	opts := toolchain.PythonOptions{Toolchain: toolchain.Pip}
	if req.GetInfo() != nil {
		var err error
		if opts, err = pythonOptions(req.Info, false); err != nil {
			return nil, err
		}
	}
	tc, err := toolchain.ResolveToolchain(opts)
	if err != nil {
		return nil, err
	}
	info, err := tc.About(ctx)
	if err != nil {
		return nil, err
	}
	return &pulumirpc.AboutResponse{
		Executable: info.PythonExecutable,
		Version:    info.PythonVersion.String(),
		Metadata:   map[string]string{"toolchain": toolchain.Name(opts.Toolchain)},
	}, nil
}

func (h *host) GetProgramDependencies(ctx context.Context, req *pulumirpc.GetProgramDependenciesRequest,
) (*pulumirpc.GetProgramDependenciesResponse, error) {
	tc, err := resolve(req.Info, false)
	if err != nil {
		return nil, err
	}
	installed, err := tc.ListPackages(ctx, req.TransitiveDependencies)
	if err != nil {
		return nil, fmt.Errorf("listing the program's Python packages: %w", err)
	}
	deps := make([]*pulumirpc.DependencyInfo, 0, len(installed))
	for _, dep := range installed {
		deps = append(deps, &pulumirpc.DependencyInfo{Name: dep.Name, Version: dep.Version})
	}
	return &pulumirpc.GetProgramDependenciesResponse{Dependencies: deps}, nil
}

func (h *host) GetRequiredPlugins(context.Context, *pulumirpc.GetRequiredPluginsRequest,
) (*pulumirpc.GetRequiredPluginsResponse, error) {
	return nil, status.Error(codes.Unimplemented, "superseded by GetRequiredPackages")
}

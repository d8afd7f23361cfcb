// kubelet-dial calls a plugin's unix sockets the way kubelet v1.37.2 does, with the
// grpc-go kubelet is built with (go.mod pins both to what tests/k8s/kubebin builds):
//
//	register SOCKET                     the plugin watcher (pkg/kubelet/pluginmanager/
//	                                    operationexecutor/operation_generator.go): dial the
//	                                    path as the target, blocking, no authority set;
//	                                    GetInfo (1 s); the DRA handler's check of the
//	                                    services; NotifyRegistrationStatus (5 s)
//	prepare ENDPOINT NS NAME UID        the DRA plugin manager (pkg/kubelet/cm/dra/plugin):
//	unprepare ENDPOINT NS NAME UID      grpc.NewClient("unix:"+endpoint), v1.DRAPlugin
//	device-plugin SOCKET                the device manager (pkg/kubelet/cm/devicemanager/
//	                                    plugin/v1beta1/client.go): authority "localhost";
//	                                    GetDevicePluginOptions
//
// Each prints one JSON line of what the plugin answered, or `error: ...` and exits 1.
// It writes none of kubelet's logic beyond these calls; dra/tests/real_kubelet_client.rs
// builds and runs it.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	dpb "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	regpb "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// What kubelet v1.37.2's DRA handler accepts, most recent first.
var servicesSupportedByKubelet = []string{drapb.DRAPluginService, "v1beta1.DRAPlugin"}

func unixDialer(ctx context.Context, addr string) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, "unix", addr)
}

func register(socket string) (any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	//nolint:staticcheck // kubelet's own (deprecated) call, kept to match it.
	conn, err := grpc.DialContext(ctx, socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(unixDialer),
	)
	if err != nil {
		return nil, fmt.Errorf("dial failed at socket %s: %w", socket, err)
	}
	defer conn.Close()
	client := regpb.NewRegistrationClient(conn)
	infoCtx, infoCancel := context.WithTimeout(context.Background(), time.Second)
	defer infoCancel()
	info, err := client.GetInfo(infoCtx, &regpb.InfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("GetInfo at socket %s: %w", socket, err)
	}
	verdict := ""
	if info.Type != regpb.DRAPlugin {
		verdict = fmt.Sprintf("no handler registered for plugin type: %s", info.Type)
	} else if !slices.ContainsFunc(info.SupportedVersions, func(s string) bool {
		return slices.Contains(servicesSupportedByKubelet, s)
	}) {
		verdict = fmt.Sprintf("none of %q is supported", info.SupportedVersions)
	}
	notifyCtx, notifyCancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer notifyCancel()
	if _, err := client.NotifyRegistrationStatus(notifyCtx, &regpb.RegistrationStatus{
		PluginRegistered: verdict == "",
		Error:            verdict,
	}); err != nil {
		return nil, fmt.Errorf("NotifyRegistrationStatus at socket %s: %w", socket, err)
	}
	if verdict != "" {
		return nil, fmt.Errorf("refused: %s", verdict)
	}
	return info, nil
}

// draCall makes one call of the DRA service through a connection made as the DRA plugin
// manager makes it, with its 45 s default call timeout.
func draCall(endpoint string, call func(context.Context, drapb.DRAPluginClient, []*drapb.Claim) (any, error), namespace, name, uid string) (any, error) {
	conn, err := grpc.NewClient("unix:"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	return call(ctx, drapb.NewDRAPluginClient(conn), []*drapb.Claim{{Namespace: namespace, Name: name, Uid: uid}})
}

func prepare(ctx context.Context, client drapb.DRAPluginClient, claims []*drapb.Claim) (any, error) {
	return client.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: claims})
}

func unprepare(ctx context.Context, client drapb.DRAPluginClient, claims []*drapb.Claim) (any, error) {
	return client.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: claims})
}

func devicePlugin(socket string) (any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	//nolint:staticcheck // kubelet's own (deprecated) call, kept to match it.
	conn, err := grpc.DialContext(ctx, socket,
		grpc.WithAuthority("localhost"),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(unixDialer),
	)
	if err != nil {
		return nil, fmt.Errorf("dial failed at socket %s: %w", socket, err)
	}
	defer conn.Close()
	callCtx, callCancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer callCancel()
	return dpb.NewDevicePluginClient(conn).GetDevicePluginOptions(callCtx, &dpb.Empty{})
}

func main() {
	args := os.Args[1:]
	want := map[string]int{"register": 1, "prepare": 4, "unprepare": 4, "device-plugin": 1}
	if len(args) == 0 || want[args[0]] == 0 || len(args)-1 != want[args[0]] {
		fmt.Fprintln(os.Stderr, "usage: kubelet-dial register SOCKET | prepare|unprepare ENDPOINT NS NAME UID | device-plugin SOCKET")
		os.Exit(2)
	}
	var answer any
	var err error
	switch args[0] {
	case "register":
		answer, err = register(args[1])
	case "prepare":
		answer, err = draCall(args[1], prepare, args[2], args[3], args[4])
	case "unprepare":
		answer, err = draCall(args[1], unprepare, args[2], args[3], args[4])
	case "device-plugin":
		answer, err = devicePlugin(args[1])
	}
	if err != nil {
		fmt.Printf("error: %v\n", err)
		os.Exit(1)
	}
	line, err := json.Marshal(answer)
	if err != nil {
		fmt.Printf("error: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(string(line))
}

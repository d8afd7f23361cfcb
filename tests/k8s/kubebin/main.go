// Command kubebin is one multi-call binary for the Kubernetes components the
// real-cluster tests run: it dispatches on the name it is called by (a link
// named kube-apiserver, kubelet, ...), so the five components link once.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if name == "kubebin" {
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, "usage: kubebin {kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|kubectl} [args...]")
			os.Exit(2)
		}
		name, args = args[0], args[1:]
	}
	var command *cobra.Command
	switch name {
	case "kube-apiserver":
		command = apiserver.NewAPIServerCommand()
	case "kube-controller-manager":
		command = controllermanager.NewControllerManagerCommand()
	case "kube-scheduler":
		command = scheduler.NewSchedulerCommand()
	case "kubelet":
		command = kubelet.NewKubeletCommand(context.Background())
	case "kubectl":
		command = kubectl.NewDefaultKubectlCommand()
	default:
		fmt.Fprintf(os.Stderr, "kubebin: unknown component %q\n", name)
		os.Exit(2)
	}
	command.SetArgs(args)
	os.Exit(cli.Run(command))
}

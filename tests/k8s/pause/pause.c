/* The sandbox ("pause") process of every pod on the test node: it holds the pod's
 * namespaces, reaps the zombies it inherits and exits on SIGINT or SIGTERM. The test
 * cluster reaches no registry, so tests/k8s/cluster.sh builds this into a one-file
 * image and names it containerd's sandbox image. Linked statically. */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signal_number) {
    (void)signal_number;
    _exit(0);
}

static void reap(int signal_number) {
    (void)signal_number;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction action = {0};
    action.sa_handler = stop;
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
    action.sa_handler = reap;
    action.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &action, NULL);
    for (;;) {
        pause();
    }
}

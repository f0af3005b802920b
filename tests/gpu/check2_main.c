/* Check 2, the host (finding N1): opens check2_plugin RTLD_LOCAL, as Python extensions and
 * plugin loaders do, and runs it. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s PLUGIN.so\n", argv[0]);
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    int (*run)(void) = (int (*)(void))dlsym(h, "plugin_run");
    if (run == NULL)
        return 2;
    int bad = run();
    printf("%s\n", bad ? "FAIL: the plugin's runtime calls failed" : "ok");
    return bad;
}

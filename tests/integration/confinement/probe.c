/* What a hostile job's own binary tries inside its container (tests/integration/test_container_confinement_runc.py).
 *
 * Built static (gcc -static) into a rootfs of its own, once plain and once as a setuid-root copy.
 * It reports, as one JSON line on stdout: who it runs as (uid, euid, effective capabilities), what
 * the instance role's credentials path of IMDS answers over IPv4 and IPv6 (the IMDSv2 token PUT,
 * then the GET), what the host agent answers (the job's credentials with the attempt's token, and
 * the relayed spot notice), whether it can write into the output and checkpoint folders, and
 * whether it can make a user namespace (docker's default seccomp profile refuses unshare).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define ROLE_PATH "/latest/meta-data/iam/security-credentials/gpujobs-instance-role"

static void json_string(const char *text) {
    putchar('"');
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if (*c == '"' || *c == '\\') printf("\\%c", *c);
        else if (*c < 0x20) printf("\\u%04x", *c);
        else putchar(*c);
    }
    putchar('"');
}

/* One HTTP/1.0 request; `out` gets "<status> <body>" or "error: <reason>". */
static void http(int family, const char *addr, int port, const char *method, const char *path,
                 const char *header, char *out, size_t size) {
    struct sockaddr_storage ss;
    socklen_t len;
    memset(&ss, 0, sizeof ss);
    if (family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons(port);
        inet_pton(AF_INET, addr, &a->sin_addr);
        len = sizeof *a;
    } else {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons(port);
        inet_pton(AF_INET6, addr, &a->sin6_addr);
        len = sizeof *a;
    }
    int fd = socket(family, SOCK_STREAM, 0);
    if (fd < 0) { snprintf(out, size, "error: socket: %s", strerror(errno)); return; }
    struct timeval limit = {10, 0}; /* a bound only: a REJECT answers at once */
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    if (connect(fd, (struct sockaddr *)&ss, len) != 0) {
        snprintf(out, size, "error: connect: %s", strerror(errno));
        close(fd);
        return;
    }
    char request[1024];
    int n = snprintf(request, sizeof request, "%s %s HTTP/1.0\r\nHost: %s\r\n%s%sContent-Length: 0\r\n\r\n",
                     method, path, addr, header, *header ? "\r\n" : "");
    if (write(fd, request, n) != n) { snprintf(out, size, "error: write: %s", strerror(errno)); close(fd); return; }
    char reply[8192];
    size_t got = 0;
    ssize_t r;
    while (got < sizeof reply - 1 && (r = read(fd, reply + got, sizeof reply - 1 - got)) > 0) got += r;
    reply[got] = 0;
    close(fd);
    int status = 0;
    sscanf(reply, "HTTP/%*s %d", &status);
    char *body = strstr(reply, "\r\n\r\n");
    snprintf(out, size, "%d %s", status, body ? body + 4 : "");
}

/* The IMDSv2 flow for the instance role's credentials: token PUT, then the GET with the token. */
static void imds_role(int family, const char *addr, char *out, size_t size) {
    char token[4096];
    http(family, addr, 80, "PUT", "/latest/api/token", "X-aws-ec2-metadata-token-ttl-seconds: 21600", token, sizeof token);
    if (strncmp(token, "200 ", 4) != 0) { snprintf(out, size, "token: %s", token); return; }
    char header[4200];
    snprintf(header, sizeof header, "X-aws-ec2-metadata-token: %s", token + 4);
    http(family, addr, 80, "GET", ROLE_PATH, header, out, size);
}

static void field(const char *name, const char *value, int last) {
    json_string(name);
    putchar(':');
    json_string(value);
    if (!last) putchar(',');
}

static void try_write(const char *name, const char *folder) {
    char path[4096], result[256] = "ok";
    if (!folder || !*folder) { field(name, "(none)", 0); return; }
    snprintf(path, sizeof path, "%s/probe.txt", folder);
    FILE *f = fopen(path, "w");
    if (!f || fputs("written\n", f) < 0 || fclose(f) != 0) snprintf(result, sizeof result, "error: %s", strerror(errno));
    field(name, result, 0);
}

int main(void) {
    char text[8192], cap[64] = "?";
    FILE *status = fopen("/proc/self/status", "r");
    while (status && fgets(text, sizeof text, status))
        if (sscanf(text, "CapEff: %63s", cap) == 1) break;
    if (status) fclose(status);
    printf("{\"uid\":%d,\"euid\":%d,", (int)getuid(), (int)geteuid());
    field("cap_eff", cap, 0);

    imds_role(AF_INET, "169.254.169.254", text, sizeof text);
    field("imds_ipv4", text, 0);
    imds_role(AF_INET6, "fd00:ec2::254", text, sizeof text);
    field("imds_ipv6", text, 0);

    /* The host agent, as botocore and the trainer's watcher find it: the variables docker run set. */
    const char *endpoint = getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT");
    const char *token = getenv("AWS_CONTAINER_AUTHORIZATION_TOKEN");
    int port = 0;
    if (endpoint) sscanf(endpoint, "http://127.0.0.1:%d", &port);
    char header[512];
    snprintf(header, sizeof header, "Authorization: %s", token ? token : "");
    if (port) http(AF_INET, "127.0.0.1", port, "GET", "/gpujobs/credentials", header, text, sizeof text);
    else snprintf(text, sizeof text, "error: no AWS_EC2_METADATA_SERVICE_ENDPOINT");
    field("agent_credentials", text, 0);
    if (port) http(AF_INET, "127.0.0.1", port, "GET", "/latest/meta-data/spot/instance-action", "", text, sizeof text);
    field("agent_spot", text, 0);

    try_write("write_outputs", getenv("GPUJOBS_OUTPUT_DIR"));
    try_write("write_checkpoints", getenv("GPUJOBS_LOCAL_CHECKPOINT_DIR"));
    field("unshare_user", unshare(CLONE_NEWUSER) == 0 ? "ok" : strerror(errno), 1);
    printf("}\n");
    return 0;
}

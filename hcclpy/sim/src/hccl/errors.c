/* HCCL result codes: names, descriptions and the error-reporting helper. */
#include <stdio.h>

#include "hccl/internal.h"

typedef struct {
    HcclResult code;
    const char *name;
    const char *text;
} result_info_t;

static const result_info_t g_results[] = {
    {HCCL_SUCCESS, "HCCL_SUCCESS", "success"},
    {HCCL_E_PARA, "HCCL_E_PARA", "parameter error"},
    {HCCL_E_PTR, "HCCL_E_PTR", "empty or invalid pointer"},
    {HCCL_E_MEMORY, "HCCL_E_MEMORY", "memory error"},
    {HCCL_E_INTERNAL, "HCCL_E_INTERNAL", "internal error"},
    {HCCL_E_NOT_SUPPORT, "HCCL_E_NOT_SUPPORT", "not supported"},
    {HCCL_E_NOT_FOUND, "HCCL_E_NOT_FOUND", "resource not found"},
    {HCCL_E_UNAVAIL, "HCCL_E_UNAVAIL", "resource unavailable"},
    {HCCL_E_SYSCALL, "HCCL_E_SYSCALL", "system call failed"},
    {HCCL_E_TIMEOUT, "HCCL_E_TIMEOUT", "timed out"},
    {HCCL_E_OPEN_FILE_FAILURE, "HCCL_E_OPEN_FILE_FAILURE", "cannot open file"},
    {HCCL_E_TCP_CONNECT, "HCCL_E_TCP_CONNECT", "TCP connection failed"},
    {HCCL_E_ROCE_CONNECT, "HCCL_E_ROCE_CONNECT", "RoCE connection failed"},
    {HCCL_E_TCP_TRANSFER, "HCCL_E_TCP_TRANSFER", "TCP transfer failed"},
    {HCCL_E_ROCE_TRANSFER, "HCCL_E_ROCE_TRANSFER", "RoCE transfer failed"},
    {HCCL_E_RUNTIME, "HCCL_E_RUNTIME", "runtime call failed"},
    {HCCL_E_DRV, "HCCL_E_DRV", "driver call failed"},
    {HCCL_E_PROFILING, "HCCL_E_PROFILING", "profiling call failed"},
    {HCCL_E_CCE, "HCCL_E_CCE", "CCE call failed"},
    {HCCL_E_NETWORK, "HCCL_E_NETWORK", "network call failed"},
    {HCCL_E_AGAIN, "HCCL_E_AGAIN", "try again"},
    {HCCL_E_REMOTE, "HCCL_E_REMOTE", "remote rank failed"},
    {HCCL_E_SUSPENDING, "HCCL_E_SUSPENDING", "communicator is suspended"},
    {HCCL_E_OPRETRY_FAIL, "HCCL_E_OPRETRY_FAIL", "operation retry failed"},
    {HCCL_E_OOM, "HCCL_E_OOM", "out of memory"},
    {HCCL_E_IN_STATUS, "HCCL_E_IN_STATUS", "see the status for the error"},
};

static const result_info_t *lookup(HcclResult code)
{
    for (size_t i = 0; i < sizeof g_results / sizeof g_results[0]; i++)
        if (g_results[i].code == code)
            return &g_results[i];
    return NULL;
}

const char *hccl_result_name(HcclResult code)
{
    const result_info_t *info = lookup(code);
    return info == NULL ? "unknown HcclResult" : info->name;
}

HCCL_API const char *HcclGetErrorString(HcclResult code)
{
    const result_info_t *info = lookup(code);
    return info == NULL ? "unknown error code" : info->text;
}

/* Formatted here first, then recorded: an argument may be the text of the previous error
 * (sim_error_text()), which recording overwrites while it is being read. */
int hccl_error(HcclResult code, const char *fmt, ...)
{
    char text[1024]; /* the size of the text sim_error keeps */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return sim_error((int)code, "%s", text);
}

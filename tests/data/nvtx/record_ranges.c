/* An NVTX tool, as Nsight Systems is one: NVTX loads the library that NVTX_INJECTION64_PATH
 * names and calls its InitializeInjectionNvtx2. This one writes each push and pop of a domain's
 * range as a line of the file NVTX_RECORD names ("push DOMAIN MESSAGE", "pop DOMAIN"), for
 * tests/test_nvtx.py and tests/test_gpu_nvtx.py. Built there with the system compiler:
 *     cc -shared -fPIC -o librecord_ranges.so record_ranges.c
 * The declarations are NVTX's own (nvtx3/nvToolsExt.h, nvtx3/nvtxDetail/nvtxTypes.h, NVTX 3),
 * written out so that no CUDA headers are needed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*fn_ptr)(void);
typedef fn_ptr **fn_table;
typedef struct {
    size_t struct_size;
    int (*GetModuleFunctionTable)(int module, fn_table *out_table, unsigned int *out_size);
} export_callbacks;
typedef const void *(*get_export_table)(uint32_t id);

enum { ETID_CALLBACKS = 1, MODULE_CORE2 = 5, PUSH_EX = 4, POP = 5, REGISTER_STRING_A = 10, CREATE_A = 12 };
enum { MESSAGE_ASCII = 1, MESSAGE_REGISTERED = 3 };

typedef struct {
    uint16_t version, size;
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type, reserved0;
    uint64_t payload;
    int32_t message_type;
    const char *message; /* ascii, or a registered string's handle: here, its copy */
} event_attributes;

static FILE *out;

static void record(const char *what, const void *domain, const char *message) {
    if (out == NULL) return;
    fprintf(out, "%s %s%s%s\n", what, domain ? (const char *)domain : "(none)", message ? " " : "", message ? message : "");
    fflush(out);
}

static void *create_domain(const char *name) { return strdup(name ? name : "(default)"); }
static void *register_string(const void *domain, const char *text) { (void)domain; return strdup(text); }

static int push(const void *domain, const event_attributes *a) {
    int known = a && (a->message_type == MESSAGE_ASCII || a->message_type == MESSAGE_REGISTERED);
    record("push", domain, known ? a->message : "?");
    return 0;
}

static int pop(const void *domain) {
    record("pop", domain, NULL);
    return 0;
}

int InitializeInjectionNvtx2(get_export_table get) {
    const export_callbacks *cb = (const export_callbacks *)get(ETID_CALLBACKS);
    fn_table table = NULL;
    unsigned int size = 0;
    const char *path = getenv("NVTX_RECORD");
    if (cb == NULL || !cb->GetModuleFunctionTable(MODULE_CORE2, &table, &size) || size <= CREATE_A) return 0;
    out = path ? fopen(path, "a") : NULL;
    *table[CREATE_A] = (fn_ptr)create_domain;
    *table[REGISTER_STRING_A] = (fn_ptr)register_string;
    *table[PUSH_EX] = (fn_ptr)push;
    *table[POP] = (fn_ptr)pop;
    return 1;
}

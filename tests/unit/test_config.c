/* Unit tests of the config reader (daemon/config.c): defaults, every error with file:line, --set. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "msm_config.h"

Test(config, defaults_pass_the_check) {
    msm_config c;
    msm_err err;
    msm_config_defaults(&c);
    cr_assert_eq(msm_config_check(&c, &err), 0, "%s", err.msg);
    cr_assert_str_eq(c.socket, "/run/msmoed/msmoed.sock");
    cr_assert_eq(c.socket_mode, 0660);
    cr_assert_eq(c.max_frame_bytes, 4 << 20);
    cr_assert_str_eq(c.tcp_host, "127.0.0.1");
}

Test(config, shipped_config_file_is_valid_and_matches_defaults) {
    msm_config c, d;
    msm_err err;
    msm_config_defaults(&c);
    msm_config_defaults(&d);
    cr_assert_eq(msm_config_load(&c, "config/msmoed.conf", &err), 0, "%s", err.msg);
    cr_assert_eq(memcmp(&c, &d, sizeof c), 0, "config/msmoed.conf documents a value that is not the default");
}

Test(config, values_parse) {
    msm_config c;
    msm_err err;
    msm_config_defaults(&c);
    const char *ini = "[server]\nsocket = /tmp/x.sock\nsocket_mode = 0600\ntcp = 7070\n"
                      "[engine]\nmulti_stream = off\nmulti_stream_max_tokens = 256\nbuckets = 1, 2, 8\nbackend = cpu\n"
                      "[scheduler]\nmax_queue = 7\n[log]\nlevel = debug\n";
    cr_assert_eq(msm_config_load_string(&c, ini, "t.conf", &err), 0, "%s", err.msg);
    cr_assert_str_eq(c.socket, "/tmp/x.sock");
    cr_assert_eq(c.socket_mode, 0600);
    cr_assert_eq(c.tcp_port, 7070);
    cr_assert(!c.multi_stream);
    cr_assert_eq(c.multi_stream_max_tokens, 256);
    cr_assert_eq(c.n_buckets, 3);
    cr_assert_eq(c.buckets[2], 8);
    cr_assert_eq(c.max_queue, 7);
    cr_assert_eq(c.log_level, MSM_LOG_DEBUG);
}

typedef struct bad_case {
    char ini[160];
    char expect[80]; /* substring of the message, which starts with t.conf:LINE */
} bad_case;

ParameterizedTestParameters(config, errors_name_file_and_line) {
    static bad_case cases[] = {
        {"[server]\n\nbogus = 1\n", "t.conf:3: unknown key 'bogus' in section [server]"},
        {"[nosuch]\nx = 1\n", "t.conf:2: unknown section [nosuch]"},
        {"[server]\ntcp = 70000\n", "t.conf:2: server.tcp = 70000 is out of range [0, 65535]"},
        {"[server]\ntcp = abc\n", "t.conf:2: server.tcp = 'abc' is not an integer"},
        {"[server]\nsocket_mode = 0999\n", "t.conf:2: server.socket_mode"},
        {"[engine]\nmulti_stream = maybe\n", "t.conf:2: engine.multi_stream = 'maybe' is not a boolean"},
        {"[engine]\nbackend = tpu\n", "t.conf:2: engine.backend = 'tpu'"},
        {"[engine]\nmulti_stream_max_tokens = -1\n", "t.conf:2: engine.multi_stream_max_tokens = -1 is out of range"},
        {"[engine]\nbuckets = 4,2\n", "t.conf:2: engine.buckets must be strictly ascending"},
        {"[engine]\nbuckets = 1,x\n", "t.conf:2: engine.buckets: 'x' is not an integer"},
        {"[engine]\nkv_blocks = 0\n", "t.conf:2: engine.kv_blocks = 0 is out of range"},
        {"[scheduler]\nmax_logprobs = 21\n", "t.conf:2: scheduler.max_logprobs = 21 is out of range"},
        {"[log]\nlevel = loud\n", "t.conf:2: log.level = 'loud'"},
        {"[server]\n# comment\nthis line has no equals sign\n", "t.conf:3: syntax error"},
        {"[server]\nmax_frame_bytes = 1\n", "t.conf:2: server.max_frame_bytes = 1 is out of range"},
    };
    return cr_make_param_array(bad_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(bad_case *bc, config, errors_name_file_and_line) {
    msm_config c;
    msm_err err = {{0}};
    msm_config_defaults(&c);
    int rc = msm_config_load_string(&c, bc->ini, "t.conf", &err);
    cr_assert_eq(rc, -EINVAL);
    cr_assert(strstr(err.msg, bc->expect), "got '%s', want '%s'", err.msg, bc->expect);
}

Test(config, set_overrides_and_errors) {
    msm_config c;
    msm_err err;
    msm_config_defaults(&c);
    cr_assert_eq(msm_config_set(&c, "engine.max_seqs=8", &err), 0, "%s", err.msg);
    cr_assert_eq(c.max_seqs, 8);
    cr_assert_eq(msm_config_set(&c, "server.socket = /tmp/a b", &err), 0);
    cr_assert_str_eq(c.socket, "/tmp/a b");
    cr_assert_eq(msm_config_set(&c, "engine.max_seqs", &err), -EINVAL);
    cr_assert(strstr(err.msg, "expected section.key=value"), "%s", err.msg);
    cr_assert_eq(msm_config_set(&c, "engine.nope=1", &err), -EINVAL);
    cr_assert(strstr(err.msg, "--set: unknown key 'nope'"), "%s", err.msg);
    cr_assert_eq(msm_config_set(&c, "engine.max_seqs=-1", &err), -EINVAL);
    cr_assert(strstr(err.msg, "--set: engine.max_seqs = -1 is out of range"), "%s", err.msg);
}

Test(config, cross_key_checks) {
    msm_config c;
    msm_err err;
    msm_config_defaults(&c);
    c.max_tokens_default = c.max_tokens_limit + 1;
    cr_assert_eq(msm_config_check(&c, &err), -EINVAL);
    cr_assert(strstr(err.msg, "max_tokens_default"));
    msm_config_defaults(&c);
    c.socket[0] = 0;
    cr_assert_eq(msm_config_check(&c, &err), -EINVAL);
    cr_assert(strstr(err.msg, "no listener"));
    msm_config_defaults(&c);
    c.max_step_tokens = 4;
    cr_assert_eq(msm_config_check(&c, &err), -EINVAL);
    cr_assert(strstr(err.msg, "max_step_tokens"));
}

/* Issue 16: inih reads a line into a fixed buffer and would split a longer one, parsing its tail
 * as a line of its own: a comment's tail could set a key. Such a line is an error naming it. */
Test(config, a_line_longer_than_the_reader_is_an_error_naming_it) {
    msm_config c;
    msm_err err = {{0}};
    static char ini[1024];
    char pad[301];
    memset(pad, 'x', 300);
    pad[300] = 0;
    snprintf(ini, sizeof ini, "[server]\nsocket = /tmp/a.sock\n# %ssocket_mode = 0777\n", pad);
    msm_config_defaults(&c);
    cr_assert_eq(msm_config_load_string(&c, ini, "t.conf", &err), -EINVAL);
    cr_assert(strstr(err.msg, "t.conf:3: line longer than"), "%s", err.msg);
    cr_assert_eq(c.socket_mode, 0660, "the comment's tail set socket_mode");
    /* a long value, and a long last line without a newline, from a file */
    char path[] = "/tmp/msmoed-conf.XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "[engine]\nmodel = /%s\n[server]\n", pad);
    fclose(f);
    msm_config_defaults(&c);
    cr_assert_eq(msm_config_load(&c, path, &err), -EINVAL);
    cr_assert(strstr(err.msg, ":2: line longer than"), "%s", err.msg);
    f = fopen(path, "w");
    fprintf(f, "[engine]\n\n\n# %s", pad);
    fclose(f);
    msm_config_defaults(&c);
    cr_assert_eq(msm_config_load(&c, path, &err), -EINVAL);
    cr_assert(strstr(err.msg, ":4: line longer than"), "%s", err.msg);
    /* lines up to the limit still read, and the lines after keep their numbers */
    f = fopen(path, "w");
    fprintf(f, "[server]\n# %.150s\nbogus = 1\n", pad);
    fclose(f);
    msm_config_defaults(&c);
    cr_assert_eq(msm_config_load(&c, path, &err), -EINVAL);
    cr_assert(strstr(err.msg, ":3: unknown key 'bogus'"), "%s", err.msg);
    unlink(path);
}

Test(config, a_remote_tcp_host_needs_tcp_allow_remote) {
    msm_config c;
    msm_err err = {{0}};
    msm_config_defaults(&c);
    c.tcp_port = 7070;
    snprintf(c.tcp_host, sizeof c.tcp_host, "0.0.0.0");
    cr_assert_eq(msm_config_check(&c, &err), -EINVAL);
    cr_assert(strstr(err.msg, "not a loopback address") && strstr(err.msg, "server.tcp_allow_remote"), "%s", err.msg);
    c.tcp_allow_remote = true;
    cr_assert_eq(msm_config_check(&c, &err), 0, "%s", err.msg);
    static const char *loopback[] = {"127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"};
    c.tcp_allow_remote = false;
    for (size_t i = 0; i < sizeof loopback / sizeof *loopback; i++) {
        snprintf(c.tcp_host, sizeof c.tcp_host, "%s", loopback[i]);
        cr_assert_eq(msm_config_check(&c, &err), 0, "%s: %s", loopback[i], err.msg);
    }
    snprintf(c.tcp_host, sizeof c.tcp_host, "localhost");
    cr_assert_eq(msm_config_check(&c, &err), -EINVAL);
    cr_assert(strstr(err.msg, "not an IPv4 or IPv6 address"), "%s", err.msg);
    snprintf(c.tcp_host, sizeof c.tcp_host, "::");
    cr_assert_eq(msm_config_check(&c, &err), -EINVAL);
}

Test(config, a_socket_path_past_the_kernel_limit_is_refused) {
    msm_config c;
    msm_err err = {{0}};
    msm_config_defaults(&c);
    memset(c.socket, 'a', 200);
    c.socket[0] = '/';
    c.socket[200] = 0;
    cr_assert_eq(msm_config_check(&c, &err), -ENAMETOOLONG);
    cr_assert(strstr(err.msg, "200 bytes long") && strstr(err.msg, "at most 107"), "%s", err.msg);
    c.socket[108] = 0;
    cr_assert_eq(msm_config_check(&c, &err), -ENAMETOOLONG);
    c.socket[107] = 0; /* 107 bytes and the NUL fill sun_path exactly */
    cr_assert_eq(msm_config_check(&c, &err), 0, "%s", err.msg);
}

Test(config, a_context_of_one_token_is_refused) {
    msm_config c;
    msm_err err = {{0}};
    msm_config_defaults(&c);
    c.max_context = 1;
    cr_assert_eq(msm_config_check(&c, &err), -EINVAL);
    cr_assert(strstr(err.msg, "engine.max_context = 1"), "%s", err.msg);
    c.max_context = 2;
    cr_assert_eq(msm_config_check(&c, &err), 0, "%s", err.msg);
}

Test(config, missing_file) {
    msm_config c;
    msm_err err;
    msm_config_defaults(&c);
    cr_assert_eq(msm_config_load(&c, "/nonexistent/msmoed.conf", &err), -ENOENT);
    cr_assert(strstr(err.msg, "/nonexistent/msmoed.conf"));
}

Test(config, model_dir_explicit_wins) {
    msm_config c;
    msm_err err;
    char out[256];
    msm_config_defaults(&c);
    snprintf(c.model, sizeof c.model, "/some/model");
    cr_assert_eq(msm_config_model_dir(&c, out, sizeof out, &err), 0);
    cr_assert_str_eq(out, "/some/model");
}

/* ---- TP groups: engine.gpus, engine.tp, engine.replicas ---- */

typedef struct gpus_case {
    char value[64];
    int n;
    int ids[16];
} gpus_case;

ParameterizedTestParameters(config, gpus_lists_and_ranges_parse) {
    static gpus_case cases[] = {
        {"0-7", 8, {0, 1, 2, 3, 4, 5, 6, 7}},
        {"0-3, 8-11", 8, {0, 1, 2, 3, 8, 9, 10, 11}},
        {"4,5", 2, {4, 5}},
        {"6-7,0-1", 4, {6, 7, 0, 1}},
        {" 3 ", 1, {3}},
        {"2-2", 1, {2}},
        {"", 0, {0}},
    };
    return cr_make_param_array(gpus_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(gpus_case *gc, config, gpus_lists_and_ranges_parse) {
    msm_config c;
    msm_err err = {{0}};
    char ini[128];
    msm_config_defaults(&c);
    snprintf(ini, sizeof ini, "[engine]\ngpus = %s\n", gc->value);
    cr_assert_eq(msm_config_load_string(&c, ini, "t.conf", &err), 0, "%s", err.msg);
    cr_assert_eq(c.n_gpus, gc->n, "'%s': %d ids", gc->value, c.n_gpus);
    cr_assert_arr_eq(c.gpus, gc->ids, (size_t)gc->n * sizeof(int), "'%s'", gc->value);
    cr_assert_str_eq(c.gpus_where, gc->n ? "t.conf:2" : "");
    cr_assert_eq(msm_config_check(&c, &err), 0, "%s", err.msg);
}

ParameterizedTestParameters(config, gpus_and_replicas_errors_name_file_and_line) {
    static bad_case cases[] = {
        {"[engine]\ngpus = 0-3,2\n", "t.conf:2: engine.gpus lists GPU 2 twice"},
        {"[engine]\ngpus = 1,1\n", "t.conf:2: engine.gpus lists GPU 1 twice"},
        {"[engine]\ngpus = 0-x\n", "t.conf:2: engine.gpus: '0-x' is not a GPU id or a range"},
        {"[engine]\ngpus = 3-1\n", "t.conf:2: engine.gpus: '3-1' is not an ascending range"},
        {"[engine]\ngpus = 0-2000\n", "t.conf:2: engine.gpus: '0-2000'"},
        {"[engine]\ngpus = ,\n", "t.conf:2: engine.gpus lists no GPU"},
        {"[engine]\nreplicas = 0\n", "t.conf:2: engine.replicas = 0 is out of range"},
        {"[engine]\nreplicas = two\n", "t.conf:2: engine.replicas = 'two' is not an integer"},
        {"[engine]\nfirst_device = 2\n", "t.conf:2: engine.first_device was replaced by engine.gpus"},
    };
    return cr_make_param_array(bad_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(bad_case *bc, config, gpus_and_replicas_errors_name_file_and_line) {
    msm_config c;
    msm_err err = {{0}};
    msm_config_defaults(&c);
    cr_assert_eq(msm_config_load_string(&c, bc->ini, "t.conf", &err), -EINVAL);
    cr_assert(strstr(err.msg, bc->expect), "got '%s', want '%s'", err.msg, bc->expect);
}

/* tp and gpus may sit on any lines (or come from --set): the check after the whole file names
 * where engine.gpus was set. */
ParameterizedTestParameters(config, tp_must_cut_gpus_into_consecutive_groups) {
    static bad_case cases[] = {
        {"[engine]\ntp = 4\n\ngpus = 0-5\n", "t.conf:4: engine.gpus = 0-5 lists 6 GPU(s), not a multiple of engine.tp = 4"},
        {"[engine]\ngpus = 0-2\ntp = 2\n", "t.conf:2: engine.gpus = 0-2 lists 3 GPU(s), not a multiple of engine.tp = 2"},
        {"[engine]\ngpus = 0,2,4,6\ntp = 2\n", "t.conf:2: engine.gpus = 0,2,4,6: TP group 0 would be GPUs 0,2, which"},
        {"[engine]\ngpus = 0-2,5\ntp = 2\n", "TP group 1 would be GPUs 2,5"},
        {"[engine]\nbackend = cuda\nreplicas = 2\n", "engine.replicas = 2 applies to the CPU backend"},
    };
    return cr_make_param_array(bad_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(bad_case *bc, config, tp_must_cut_gpus_into_consecutive_groups) {
    msm_config c;
    msm_err err = {{0}};
    msm_config_defaults(&c);
    cr_assert_eq(msm_config_load_string(&c, bc->ini, "t.conf", &err), 0, "%s", err.msg);
    cr_assert_eq(msm_config_check(&c, &err), -EINVAL);
    cr_assert(strstr(err.msg, bc->expect), "got '%s', want '%s'", err.msg, bc->expect);
}

Test(config, gpus_set_from_the_command_line_says_so) {
    msm_config c;
    msm_err err = {{0}};
    msm_config_defaults(&c);
    cr_assert_eq(msm_config_set(&c, "engine.gpus=0-5", &err), 0, "%s", err.msg);
    cr_assert_eq(msm_config_set(&c, "engine.tp=4", &err), 0, "%s", err.msg);
    cr_assert_eq(msm_config_check(&c, &err), -EINVAL);
    cr_assert(strstr(err.msg, "--set: engine.gpus = 0-5 lists 6 GPU(s)"), "%s", err.msg);
    /* Clearing it goes back to the default: every visible GPU, nothing to point at. */
    cr_assert_eq(msm_config_set(&c, "engine.gpus=", &err), 0, "%s", err.msg);
    cr_assert_eq(c.n_gpus, 0);
    cr_assert_str_eq(c.gpus_where, "");
    cr_assert_eq(msm_config_check(&c, &err), 0, "%s", err.msg);
}

typedef struct plan_case {
    char ini[96];
    bool cuda;
    int n_visible;
    int n_groups;             /* -1: an error containing `expect` */
    int first[8];
    char expect[96];
} plan_case;

ParameterizedTestParameters(config, groups_are_planned_per_backend) {
    static plan_case cases[] = {
        /* DESIGN.md §4: gpus = 0-7, tp = 4 -> two groups. */
        {"[engine]\ngpus = 0-7\ntp = 4\n", true, 8, 2, {0, 4}, ""},
        {"[engine]\ngpus = 0-7\ntp = 4\n", true, -1, 2, {0, 4}, ""},
        {"[engine]\ntp = 2\n", true, 8, 4, {0, 2, 4, 6}, ""},
        {"[engine]\n", true, 1, 1, {0}, ""},
        {"[engine]\ngpus = 6-7,2-3\ntp = 2\n", true, 8, 2, {6, 2}, ""},
        {"[engine]\ngpus = 3\n", true, 8, 1, {3}, ""},
        {"[engine]\ntp = 4\n", true, 6, -1, {0}, "engine.gpus (empty: every visible GPU, 0-5) lists 6 GPU(s), not a multiple of engine.tp = 4"},
        {"[engine]\n", true, 0, -1, {0}, "no GPU is visible"},
        {"[engine]\ngpus = 4-7\ntp = 2\n", true, 4, -1, {0}, "t.conf:2: engine.gpus lists GPU 4, but 4 GPU(s) are visible"},
        {"[engine]\nreplicas = 2\n", true, 8, -1, {0}, "engine.replicas = 2 applies to the CPU backend"},
        /* CPU: replicas groups; gpus is not used. */
        {"[engine]\n", false, -1, 1, {0}, ""},
        {"[engine]\nreplicas = 3\ntp = 2\n", false, -1, 3, {0, 0, 0}, ""},
        {"[engine]\nreplicas = 2\ngpus = 0-3\ntp = 2\n", false, 0, 2, {0, 0}, ""},
    };
    return cr_make_param_array(plan_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(plan_case *pc, config, groups_are_planned_per_backend) {
    msm_config c;
    msm_err err = {{0}};
    msm_group_plan p;
    msm_config_defaults(&c);
    cr_assert_eq(msm_config_load_string(&c, pc->ini, "t.conf", &err), 0, "%s", err.msg);
    int rc = msm_config_plan_groups(&c, pc->cuda, pc->n_visible, &p, &err);
    if (pc->n_groups < 0) {
        cr_assert_lt(rc, 0, "'%s' should fail", pc->ini);
        cr_assert(strstr(err.msg, pc->expect), "got '%s', want '%s'", err.msg, pc->expect);
        return;
    }
    cr_assert_eq(rc, 0, "%s", err.msg);
    cr_assert_eq(p.n_groups, pc->n_groups);
    cr_assert_arr_eq(p.first_device, pc->first, (size_t)pc->n_groups * sizeof(int));
}

Test(config, gpu_list_formats_as_ranges) {
    static const int ids[] = {0, 1, 2, 3, 6, 8, 9};
    char buf[64];
    msm_config_format_gpus(ids, 7, buf, sizeof buf);
    cr_assert_str_eq(buf, "0-3,6,8-9");
    msm_config_format_gpus(ids, 0, buf, sizeof buf);
    cr_assert_str_eq(buf, "");
}

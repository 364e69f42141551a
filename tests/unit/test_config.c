/* Unit tests of the config reader (daemon/config.c): defaults, every error with file:line, --set. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

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
                      "[engine]\nmulti_stream = off\nbuckets = 1, 2, 8\nbackend = cpu\n"
                      "[scheduler]\nmax_queue = 7\n[log]\nlevel = debug\n";
    cr_assert_eq(msm_config_load_string(&c, ini, "t.conf", &err), 0, "%s", err.msg);
    cr_assert_str_eq(c.socket, "/tmp/x.sock");
    cr_assert_eq(c.socket_mode, 0600);
    cr_assert_eq(c.tcp_port, 7070);
    cr_assert(!c.multi_stream);
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

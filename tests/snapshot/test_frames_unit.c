/* The user's frame (analysis/frames.h): the default table, picking, the fallback, user
 * rules, names and keys, and the call-site rows of memtrace's own stacks (callsite.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "tests/common/test_main.h"

#include "analysis/callsite.h"
#include "analysis/frames.h"
#include "analysis/torch_snapshot.h"
#include "memtrace/alloc.h"
#include "util/text.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* A PyTorch 2.x stack as its snapshot writes it, innermost first; the user's is [16]. */
static const mt_fr_frame_t torch_stack[] = {
    {.func = "torch::unwind::unwind()", .file = "??"},
    {.func = "torch::CapturedTraceback::gather(bool, bool, bool)", .file = "??"},
    {.func = "torch::cuda::(anonymous namespace)::gather_with_cpp()",
     .file = "memory_snapshot.cpp"},
    {.func = "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int)",
     .file = "CUDACachingAllocator.cpp"},
    {.func = "at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>)", .file = ""},
    {.func = "bool at::native::_resize_output<long>(at::Tensor const&)", .file = ""},
    {.func = "at::(anonymous namespace)::wrapper_CUDA_mm(at::Tensor const&)",
     .file = "RegisterCUDA.cpp"},
    {.func = "c10::impl::BoxedKernelWrapper<>::call()", .file = "BoxedKernel_impl.h"},
    {.func = "torch::autograd::VariableType::mm()", .file = "VariableType_3.cpp"},
    {.func = "void std::__invoke_impl<void>()", .file = "??"},
    {.func = "cfunction_call", .file = "/usr/src/python-3.11/Objects/methodobject.c", .line = 537},
    {.func = "_PyEval_EvalFrameDefault", .file = "??"},
    {.func = "PyObject_Call", .file = "??"},
    {.func = "_call_impl",
     .file = "/opt/env/lib/python3.11/site-packages/torch/nn/modules/module.py",
     .line = 1527,
     .python = true},
    {.func = "forward", .file = "torch/nn/modules/linear.py", .line = 116, .python = true},
    {.func = "infinite_lru_cache_wrapper", .file = "??"},
    {.func = "forward", .file = "/home/me/proj/transformer.py", .line = 54, .python = true},
    {.func = "main", .file = "/home/me/proj/train.py", .line = 9, .python = true},
};

static void test_default_table(void **state)
{
    (void)state;
    size_t n;
    const mt_fr_rule_t *r = mt__fr_default_rules(&n);
    assert_true(n >= 20);
    for (size_t i = 0; i < n; i++) {
        assert_non_null(r[i].pattern);
        assert_non_null(r[i].reason);
        assert_true(r[i].reason[0] != '\0');
        assert_true(r[i].cls == MT_FR_RECORDER || r[i].cls == MT_FR_FRAMEWORK);
        /* recorder rules first: mt__fr_match returns the first that matches */
        if (i > 0 && r[i].cls == MT_FR_RECORDER)
            assert_int_equal(r[i - 1].cls, MT_FR_RECORDER);
    }
}

static void test_pick_torch(void **state)
{
    (void)state;
    assert_int_equal(mt__fr_pick(NULL, torch_stack, N(torch_stack)), 16);
    char buf[128];
    assert_string_equal(mt__fr_site(&torch_stack[16], buf, sizeof buf),
                        "transformer.py:54 forward");
    /* why each one before it is skipped */
    assert_string_equal(mt__fr_match(NULL, &torch_stack[0])->reason, "PyTorch's stack unwinder");
    assert_int_equal(mt__fr_match(NULL, &torch_stack[3])->cls, MT_FR_RECORDER);
    for (int i = 0; i < 16; i++)
        assert_non_null(mt__fr_match(NULL, &torch_stack[i]));
    /* a Python function named like a C++ namespace is still the user's */
    mt_fr_frame_t py = {.func = "at::helper", .file = "/home/me/at.py", .line = 3, .python = true};
    assert_null(mt__fr_match(NULL, &py));
    assert_int_equal(mt__fr_pick(NULL, NULL, 0), -1);
}

static void test_fallback(void **state)
{
    (void)state;
    /* autograd's thread: nothing of the user's; the first frame past the recorder */
    mt_fr_frame_t s[] = {torch_stack[0], torch_stack[3], torch_stack[4], torch_stack[5]};
    assert_int_equal(mt__fr_pick(NULL, s, N(s)), 2);
    /* only the recorder: its innermost frame */
    assert_int_equal(mt__fr_pick(NULL, s, 2), 0);
}

/* An allocation on autograd's engine thread, as PyTorch 2.x's snapshots write it
 * (innermost first, as in a public cs336 snapshot): no frame of the user's. */
static const mt_fr_frame_t backward_stack[] = {
    {.func = "torch::unwind::unwind()", .file = "??"},
    {.func = "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int)",
     .file = "CUDACachingAllocator.cpp"},
    {.func = "at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>)", .file = ""},
    {.func = "at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)",
     .file = "??"},
    {.func = "at::_ops::bmm::redispatch(c10::DispatchKeySet, at::Tensor const&)", .file = "??"},
    {.func = "torch::autograd::VariableType::(anonymous namespace)::bmm(c10::DispatchKeySet)",
     .file = "VariableType_2.cpp"},
    {.func = "at::_ops::bmm::call(at::Tensor const&, at::Tensor const&)", .file = "??"},
    {.func = "torch::autograd::generated::BmmBackward0::apply(std::vector<at::Tensor>&&)",
     .file = "??"},
    {.func = "torch::autograd::Engine::thread_main(std::shared_ptr<GraphTask> const&)",
     .file = "??"},
    {.func = "execute_native_thread_routine", .file = "thread48.o"},
    {.func = "clone", .file = "??"},
};

static void test_fallback_names_what_ran(void **state)
{
    (void)state;
    char buf[128];
    /* autograd's node first, named as PyTorch's profiler names it; the thread start of the
     * C++ library is not the user's (a frame with a file of libstdc++'s build) */
    int k = mt__fr_pick(NULL, backward_stack, N(backward_stack));
    assert_int_equal(k, 7);
    assert_string_equal(mt__fr_site(&backward_stack[k], buf, sizeof buf),
                        "BmmBackward0 (autograd)");
    assert_non_null(mt__fr_match(NULL, &backward_stack[9]));
    /* glibc's thread start with its build tree's file (a public snapshot's) */
    mt_fr_frame_t st = {.func = "start_thread",
                        .file = "/build/glibc-B3wQXB/glibc-2.31/nptl/pthread_create.c",
                        .line = 477};
    assert_non_null(mt__fr_match(NULL, &st));
    /* a conda build's thread start (libstdc++'s relative source path) and glibc's from an
     * Ubuntu build (paths relative to its tree), as a public 2.x snapshot has them under a
     * cuBLAS workspace that AddmmBackward0 allocated */
    mt_fr_frame_t conda[] = {
        backward_stack[0],
        backward_stack[1],
        {.func = "at::cuda::getNewWorkspace()", .file = ""},
        {.func = "torch::autograd::generated::AddmmBackward0::apply(std::vector<at::Tensor>&&)",
         .file = "??"},
        {.func = "torch::autograd::Engine::thread_main(std::shared_ptr<GraphTask> const&)",
         .file = "??"},
        {.func = "execute_native_thread_routine",
         .file = "/home/conda/feedstock_root/build_artifacts/gcc_compilers_1654084175708/work/gcc/"
                 "libstdc++-v3/src/c++11/thread.cc",
         .line = 82},
        {.func = "start_thread", .file = "./nptl/pthread_create.c", .line = 442},
        {.func = "__clone3",
         .file = "./misc/../sysdeps/unix/sysv/linux/x86_64/clone3.S",
         .line = 81},
    };
    k = mt__fr_pick(NULL, conda, N(conda));
    assert_int_equal(k, 3);
    assert_string_equal(mt__fr_site(&conda[k], buf, sizeof buf), "AddmmBackward0 (autograd)");
    for (size_t i = 5; i < N(conda); i++)
        assert_non_null(mt__fr_match(NULL, &conda[i]));
    /* PyTorch's Python bindings, which have no namespace (a free's stack passes them) */
    mt_fr_frame_t thp = {.func = "THPVariable_clear(THPVariable*)", .file = "python_variable.cpp"};
    assert_non_null(mt__fr_match(NULL, &thp));
    /* without the node: the innermost ATen operator's entry */
    k = mt__fr_pick(NULL, backward_stack, 7);
    assert_int_equal(k, 4);
    assert_string_equal(mt__fr_site(&backward_stack[k], buf, sizeof buf), "aten::bmm");
    /* without either: the first frame past the recorder, as before */
    assert_int_equal(mt__fr_pick(NULL, backward_stack, 4), 2);
    /* a user frame still wins over any of them */
    mt_fr_frame_t mixed[] = {backward_stack[6], backward_stack[7], torch_stack[16]};
    assert_int_equal(mt__fr_pick(NULL, mixed, N(mixed)), 2);
    /* a gradient's first accumulation, on autograd's thread (a public cs336 snapshot):
     * AccumulateGrad is a node that no code generator wrote */
    mt_fr_frame_t acc[] = {
        backward_stack[0],
        backward_stack[1],
        {.func = "at::_ops::new_empty_strided::call(at::Tensor const&)", .file = "??"},
        {.func = "torch::autograd::utils::clone_obey_contract(at::Tensor const&)", .file = ""},
        {.func = "void torch::autograd::AccumulateGrad::accumulateGrad<std::function<void "
                 "(at::Tensor&&)> >(at::Tensor const&)",
         .file = ""},
        {.func = "torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor>&&)", .file = "??"},
        {.func = "torch::autograd::Node::operator()(std::vector<at::Tensor>&&)", .file = ""},
        backward_stack[8],
    };
    k = mt__fr_pick(NULL, acc, N(acc));
    assert_int_equal(k, 5);
    assert_string_equal(mt__fr_site(&acc[k], buf, sizeof buf), "AccumulateGrad (autograd)");
    assert_string_equal(mt__fr_key(&acc[k], MT_FR_BY_MODULE, buf, sizeof buf), "autograd");
    assert_string_equal(mt__fr_key(&acc[2], MT_FR_BY_MODULE, buf, sizeof buf), "aten");
    assert_string_equal(mt__fr_key(&acc[6], MT_FR_BY_MODULE, buf, sizeof buf), "??");
    mt_fr_frame_t slices = {.func = "torch::autograd::CopySlices::apply(variable_list&&)"};
    assert_string_equal(mt__fr_site(&slices, buf, sizeof buf), "CopySlices (autograd)");
    /* "::apply(" in a parameter's text names no node */
    mt_fr_frame_t tmpl = {.func = "torch::autograd::run<F>(decltype(std::apply(f)))"};
    assert_string_equal(mt__fr_site(&tmpl, buf, sizeof buf),
                        "torch::autograd::run<F>(decltype(std::apply(f)))");
    /* the names are taken only from those two namespaces' entries */
    mt_fr_frame_t other = {.func = "torch::autograd::generated::details::helper()", .file = "??"};
    assert_string_equal(mt__fr_site(&other, buf, sizeof buf),
                        "torch::autograd::generated::details::helper()");
}

/* A stack recorded on Windows (a public cs336 snapshot): '\\' separators. */
static void test_windows_paths(void **state)
{
    (void)state;
    char buf[128];
    mt_fr_frame_t s[] = {
        {.func = "einsum",
         .file = "D:\\Dev\\a2\\.venv\\Lib\\site-packages\\torch\\functional.py",
         .line = 373,
         .python = true},
        {.func = "run", .file = "C:\\Python311\\Lib\\threading.py", .line = 9, .python = true},
        {.func = "forward",
         .file = "D:\\Dev\\a2\\cs336_basics\\model.py",
         .line = 101,
         .python = true},
    };
    assert_non_null(mt__fr_match(NULL, &s[0])); /* an installed package */
    assert_non_null(mt__fr_match(NULL, &s[1])); /* the standard library */
    assert_null(mt__fr_match(NULL, &s[2]));
    assert_int_equal(mt__fr_pick(NULL, s, N(s)), 2);
    assert_string_equal(mt__fr_site(&s[2], buf, sizeof buf), "model.py:101 forward");
    /* a Unix path keeps its backslash-free search */
    assert_string_equal(mt__fr_site(&torch_stack[16], buf, sizeof buf),
                        "transformer.py:54 forward");
}

/* A function of a file's own unnamed namespace is matched by the rule of its name (a public
 * 2.x snapshot: THPFunction_apply was taken for the user's site). */
static void test_anonymous_namespace(void **state)
{
    (void)state;
    char buf[128];
    mt_fr_frame_t s[] = {
        {.func = "(anonymous namespace)::THPFunction_apply(_object*, _object*)",
         .file = "python_function.cpp",
         .line = 0},
        {.func = "at::(anonymous namespace)::create_out(c10::ArrayRef<long>)",
         .file = "RegisterCUDA_0.cpp"},
        {.func = "(anonymous namespace)::my_kernel_launch()", .file = "ext.cpp", .line = 7},
        {.func = "train", .file = "trainers.py", .line = 444, .python = true},
    };
    assert_non_null(mt__fr_match(NULL, &s[0])); /* THP... */
    assert_non_null(mt__fr_match(NULL, &s[1])); /* at:: */
    assert_null(mt__fr_match(NULL, &s[2]));     /* the user's own C++ */
    assert_null(mt__fr_match(NULL, &s[3]));
    mt_fr_frame_t torch_only[] = {s[0], s[1], s[3]};
    assert_int_equal(mt__fr_pick(NULL, torch_only, N(torch_only)), 2);
    assert_string_equal(mt__fr_site(&torch_only[2], buf, sizeof buf), "trainers.py:444 train");
}

static void test_user_rules(void **state)
{
    (void)state;
    mt_fr_rules_t *r = NULL;
    assert_int_equal(mt__fr_rules_create(&r, false), 0);
    assert_int_equal(mt__fr_rules_add(r, "file:"), MT_EINVAL);
    assert_int_equal(mt__fr_rules_add(r, ""), MT_EINVAL);
    assert_int_equal(mt__fr_rules_add(r, "file:transformer.py"), 0);
    assert_int_equal(mt__fr_pick(r, torch_stack, N(torch_stack)), 17);
    mt__fr_rules_destroy(&r);
    assert_null(r);
    /* text alone: a function prefix or a file's text */
    assert_int_equal(mt__fr_rules_create(&r, false), 0);
    assert_int_equal(mt__fr_rules_add(r, "forw"), 0);
    assert_int_equal(mt__fr_pick(r, torch_stack, N(torch_stack)), 17);
    assert_string_equal(mt__fr_match(r, &torch_stack[16])->reason, "--skip-frames");
    mt__fr_rules_destroy(&r);
    /* all: no rule applies */
    assert_int_equal(mt__fr_rules_create(&r, true), 0);
    assert_true(mt__fr_rules_all(r));
    assert_int_equal(mt__fr_pick(r, torch_stack, N(torch_stack)), 0);
    mt__fr_rules_destroy(&r);
}

static void test_keys(void **state)
{
    (void)state;
    char buf[256];
    const mt_fr_frame_t *f = &torch_stack[16];
    assert_string_equal(mt__fr_key(f, MT_FR_BY_SITE, buf, sizeof buf), "transformer.py:54 forward");
    assert_string_equal(mt__fr_key(f, MT_FR_BY_FUNCTION, buf, sizeof buf),
                        "forward (transformer.py)");
    assert_string_equal(mt__fr_key(f, MT_FR_BY_FILE, buf, sizeof buf), "transformer.py");
    assert_string_equal(mt__fr_key(f, MT_FR_BY_MODULE, buf, sizeof buf), "transformer");
    mt_fr_frame_t native = {.func = "kernel", .module = "/usr/lib/libx.so.1"};
    assert_string_equal(mt__fr_key(&native, MT_FR_BY_MODULE, buf, sizeof buf), "libx.so.1");
    assert_string_equal(mt__fr_site(&native, buf, sizeof buf), "kernel");
    assert_string_equal(
        mt__fr_stack_key(NULL, torch_stack, N(torch_stack), MT_FR_BY_STACK, buf, sizeof buf),
        "transformer.py:54 forward <- train.py:9 main");
    char small[16];
    mt__fr_stack_key(NULL, torch_stack, N(torch_stack), MT_FR_BY_STACK, small, sizeof small);
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_string_equal(small + sizeof small - 4, "...");
    assert_int_equal(mt__fr_by_parse("callsite"), MT_FR_BY_SITE);
    assert_int_equal(mt__fr_by_parse("tag"), MT_FR_BY_TAG);
    assert_int_equal(mt__fr_by_parse("line"), -1);
    for (int b = 0; b < MT_FR_BY_COUNT; b++)
        assert_int_equal(mt__fr_by_parse(mt__fr_by_name(b)), b);
}

/* The nn.Module chain (--by modules): each module's forward, outermost first, from the
 * model's outermost module to the user's frame; a helper inside a module and the training
 * loop outside the model are left out. Innermost first, as a snapshot writes it. */
#define MOD_PY "/opt/env/lib/python3.11/site-packages/torch/nn/modules/module.py"
static const mt_fr_frame_t module_stack[] = {
    {.func = "at::mm(at::Tensor const&)", .file = "??"},
    {.func = "forward", .file = "/home/me/proj/layers.py", .line = 22, .python = true},
    {.func = "_call_impl", .file = MOD_PY, .line = 1527, .python = true},
    {.func = "_wrapped_call_impl", .file = MOD_PY, .line = 1518, .python = true},
    {.func = "attend", .file = "/home/me/proj/attn.py", .line = 40, .python = true},
    {.func = "forward", .file = "/home/me/proj/attn.py", .line = 60, .python = true},
    {.func = "_PyEval_EvalFrameDefault", .file = "??"},
    {.func = "_call_impl", .file = MOD_PY, .line = 1527, .python = true},
    {.func = "forward", .file = "/home/me/proj/model.py", .line = 88, .python = true},
    {.func = "_call_impl", .file = MOD_PY, .line = 1527, .python = true},
    {.func = "train_step", .file = "/home/me/proj/train.py", .line = 30, .python = true},
    {.func = "<module>", .file = "/home/me/proj/train.py", .line = 80, .python = true},
};

static void test_module_chain(void **state)
{
    (void)state;
    char buf[256];
    assert_true(mt__fr_module_call(&module_stack[2]));
    assert_false(mt__fr_module_call(&module_stack[1]));
    assert_string_equal(
        mt__fr_stack_key(NULL, module_stack, N(module_stack), MT_FR_BY_MODULES, buf, sizeof buf),
        "model.py:88 forward > attn.py:60 forward > layers.py:22 forward");
    /* Outside any module the key is the user's frame, as by site. */
    assert_string_equal(
        mt__fr_stack_key(NULL, module_stack + 10, 2, MT_FR_BY_MODULES, buf, sizeof buf),
        "train.py:30 train_step");
    /* A helper of a module is the user's frame; the chain starts at its module. */
    assert_string_equal(mt__fr_stack_key(NULL, module_stack + 4, N(module_stack) - 4,
                                         MT_FR_BY_MODULES, buf, sizeof buf),
                        "model.py:88 forward > attn.py:60 forward > attn.py:40 attend");
    assert_int_equal(mt__fr_by_parse("modules"), MT_FR_BY_MODULES);
}

/* memtrace's own stacks: the row's site is the user's frame, past torch's Python. */
static void test_callsite_rows(void **state)
{
    (void)state;
    mt_sym_t *s = NULL;
    assert_int_equal(mt__sym_create(&s), 0);
    const mt_cs_frame_t frames[] = {
        {.py_func = "_conv_forward",
         .py_file = "/usr/lib/python3/dist-packages/torch/nn/modules/conv.py",
         .py_line = 456},
        {.py_func = "_call_impl",
         .py_file = "/usr/lib/python3/dist-packages/torch/nn/modules/module.py",
         .py_line = 1527},
        {.py_func = "Model.forward", .py_file = "/src/model.py", .py_line = 12},
        {.py_func = "main", .py_file = "/src/train.py", .py_line = 40},
    };
    mt_cs_row_t row = {.stack = 1, .bytes = 8 << 20, .blocks = 1, .frames = frames, .n_frames = 4};
    json_t *a = mt__cs_rows_json(s, 1, &row, 1, 10, false);
    assert_non_null(a);
    json_t *r = json_array_get(a, 0);
    assert_string_equal(json_string_value(json_object_get(r, "site")),
                        "Model.forward (model.py:12)");
    assert_int_equal(json_integer_value(json_object_get(r, "user_frame")), 2);
    json_decref(a);
    mt__sym_destroy(&s);
}

/* A snapshot stack as the page shows it (mt__ts_stack_view) stays JSON when its site is
 * cut inside a character: a 700-byte name with a two-byte 'é' across the cut. */
static void test_stack_view_cut_name(void **state)
{
    (void)state;
    char name[700];
    memset(name, 'a', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    name[510] = (char)0xc3; /* é: its second byte is past the site's 511 */
    name[511] = (char)0xa9;
    mt_ts_t *ts = NULL;
    mt_ts_frame_t f = {.name = name, .filename = "??", .line = 0};
    uint32_t id;
    assert_int_equal(mt__ts_create(&ts), 0);
    assert_int_equal(mt__ts_add_stack(ts, &f, 1, &id), 0);
    json_t *v = mt__ts_stack_view(ts, id, NULL);
    assert_non_null(v);
    const char *site = json_string_value(json_object_get(v, "site"));
    assert_non_null(site);
    assert_true(mt__text_is_utf8(site));
    assert_int_equal(strncmp(site, name, 510), 0);
    assert_int_equal(json_array_size(json_object_get(v, "frames")), 1);
    json_decref(v);
    mt__ts_destroy(&ts);
    /* the names and keys themselves end on a whole character, "..." included */
    mt_fr_frame_t fr[2] = {{.func = name, .file = "??"},
                           {.func = "main", .file = "ü.py", .line = 1}};
    char buf[512], key[16];
    assert_true(mt__text_is_utf8(mt__fr_site(&fr[0], buf, sizeof buf)));
    assert_int_equal(strlen(buf), 510);
    for (size_t len = 5; len < sizeof key; len++) {
        mt_fr_frame_t two[2] = {{.func = "x", .file = "éé.py", .line = 1}, fr[1]};
        mt__fr_stack_key(NULL, two, 2, MT_FR_BY_STACK, key, len);
        assert_true(mt__text_is_utf8(key));
        assert_true(strlen(key) < len);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_table),
        cmocka_unit_test(test_pick_torch),
        cmocka_unit_test(test_fallback),
        cmocka_unit_test(test_fallback_names_what_ran),
        cmocka_unit_test(test_windows_paths),
        cmocka_unit_test(test_user_rules),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_module_chain),
        cmocka_unit_test(test_callsite_rows),
        cmocka_unit_test(test_anonymous_namespace),
        cmocka_unit_test(test_stack_view_cut_name),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}

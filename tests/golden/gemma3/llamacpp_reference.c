// Greedy reference for tests/golden/gemma3/make_llamacpp_reference.py (never built in CI).
//
// usage: llamacpp_reference MODEL.gguf STEPS TOPK < prompts
// Each stdin line is one prompt's text with "\n" escaped as the two characters \ and n.
// The text is tokenized by llama.cpp (special tokens parsed, nothing added: the text
// carries its own <bos>), decoded in one batch, then STEPS greedy tokens are decoded one
// at a time (EOS does not stop the loop). Per prompt one line goes to stdout:
//   ids: PROMPT IDS | step: ID ID:LOGIT ... (TOPK pairs, the first the argmax) | step ...
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"

static int argmax_top(const float *logits, int n, int k, int *ids) {
    for (int j = 0; j < k; j++) ids[j] = -1;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < k; j++) {
            if (ids[j] < 0 || logits[i] > logits[ids[j]]) {
                for (int m = k - 1; m > j; m--) ids[m] = ids[m - 1];
                ids[j] = i;
                break;
            }
        }
    }
    return ids[0];
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: %s MODEL STEPS TOPK\n", argv[0]); return 2; }
    int steps = atoi(argv[2]), topk = atoi(argv[3]);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = false;  // the AMX repacked products of this build crash here
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    static char line[1 << 16], text[1 << 16];
    int *ids = malloc(sizeof(int) * topk);
    while (fgets(line, sizeof line, stdin)) {
        size_t n = 0;
        for (size_t i = 0; line[i] && line[i] != '\n'; i++) {
            if (line[i] == '\\' && line[i + 1] == 'n') { text[n++] = '\n'; i++; }
            else text[n++] = line[i];
        }
        text[n] = 0;
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 2048; cp.n_batch = 2048; cp.n_ubatch = 2048;
        cp.n_threads = 2; cp.n_threads_batch = 2;
        struct llama_context *ctx = llama_init_from_model(model, cp);
        llama_token tokens[4096];
        int count = llama_tokenize(vocab, text, (int)n, tokens, 4096, false, true);
        if (count < 0) { fprintf(stderr, "tokenize failed\n"); return 1; }
        printf("ids:");
        for (int i = 0; i < count; i++) printf(" %d", tokens[i]);
        if (llama_decode(ctx, llama_batch_get_one(tokens, count))) return 1;
        for (int s = 0; s < steps; s++) {
            const float *logits = llama_get_logits_ith(ctx, -1);
            llama_token next = argmax_top(logits, n_vocab, topk, ids);
            printf(" | step: %d", next);
            for (int j = 0; j < topk; j++) printf(" %d:%.6f", ids[j], logits[ids[j]]);
            if (llama_decode(ctx, llama_batch_get_one(&next, 1))) return 1;
        }
        printf("\n");
        fflush(stdout);
        llama_free(ctx);
    }
    llama_model_free(model);
    return 0;
}

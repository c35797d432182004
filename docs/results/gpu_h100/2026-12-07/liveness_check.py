"""The check run on the H100 (2026-12-07) that `_vllm_internals.liveness` applies on stock vLLM
0.26.0: its synchronous client has the outputs queue and dead flag the patch needs, the patch
takes, and the engine still generates. Ran with scripts/gpu_run.sh's gpu_env exported:
    python3 liveness_check.py     (from the repository root)"""
if __name__ == "__main__":
    import vllm
    from vllm import LLM

    from gambit_search._vllm_internals import fail_fast_on_death
    llm = LLM(model="checkpoints/toy-policy", gpu_memory_utilization=0.05, max_model_len=512,
              enforce_eager=True)
    c = llm.llm_engine.engine_core
    print("vllm", vllm.__version__, "client", type(c).__name__,
          "queue", type(getattr(c, "outputs_queue", None)).__name__,
          "dead_attr", hasattr(getattr(c, "resources", None), "engine_dead"))
    print("applied", fail_fast_on_death(llm), type(getattr(c, "outputs_queue", None)).__name__)
    print(llm.generate(["1 2 3"], vllm.SamplingParams(max_tokens=4))[0].outputs[0].token_ids)

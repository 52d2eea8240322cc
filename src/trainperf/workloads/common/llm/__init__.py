"""The decoder language models' family: the Llama and mixture-of-experts models, C4 and Megatron's indexed
datasets, the generated Markov corpus, the recipes' shared fields, NeMo's schedule and the workload base
classes that llama31_8b, llama31_405b, gpt_oss_20b, deepseekv3_671b (and llama2_70b_lora, flux1) build on."""

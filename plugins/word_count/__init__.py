"""The plugin docs/plugins.md writes: token counts and vector norms of a list of texts."""

from poolserve_plugins import IOProcessor, PoolingParams

def register():
    return "word_count.WordCount"

class WordCount(IOProcessor):
    def parse_data(self, data):
        if not isinstance(data, dict) or not isinstance(data.get("texts"), list):
            raise ValueError("data must be {\"texts\": [...]}")   # 400 to the client
        return data

    def merge_pooling_params(self, params=None):
        return PoolingParams(task="embed")

    def pre_process(self, prompt, request_id=None, **kwargs):
        return prompt["texts"]                                     # one prompt per text

    def post_process(self, model_output, request_id=None, **kwargs):
        return [{"tokens": len(o.prompt_token_ids), "norm": sum(x * x for x in o.outputs.data.tolist()) ** 0.5}
                for o in model_output]

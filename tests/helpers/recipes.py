"""A tiny study recipe (a file of pretrain_fixedcode.py flags), shared by the study tests."""

TINY_RECIPE = """# a tiny study recipe
--num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128
--seq-length 32 --max-position-embeddings 64 --micro-batch-size 2 --global-batch-size 4
--lr 3e-3 --mock-data --log-interval 1 --eval-iters 0 --num-workers 0 --train-iters 3
"""

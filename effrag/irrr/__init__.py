"""IRRR (Qi et al., 2021): iterative retriever, reader and reranker in one encoder.

``oracle`` derives search queries, ``data`` builds training steps, ``encoding`` lays out
reasoning paths, its task ``effrag.training.tasks.irrr`` trains the model with the shared loop (``train.py``), and
``effrag.pipelines.irrr`` runs it. The model is ``effrag.models.IRRRModel``.
"""

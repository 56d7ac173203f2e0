"""The local development stack: tritonserver from the nvidia-pytriton wheel, ``moto_server``,
``mlflow server`` and the managed processes behind ``mlreg stack``.

The application (``mlreg``) and the tests start it; the promotion never imports it (a layer test
checks): it reaches servers only through the URLs and factories the application hands it.
"""

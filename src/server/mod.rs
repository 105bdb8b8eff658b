//! Startup: bind the port at once (so /health can say 503 while loading), load and warm the
//! model off the async runtime, then serve until SIGINT/SIGTERM: HTTP/1.1 and HTTP/2 (h2c with
//! prior knowledge, as gRPC clients speak it) on one port ([`connections`]), under TLS with
//! `--ssl-certfile` ([`tls`]).

pub mod connections;
pub mod cors;
pub mod prefix;
pub mod tls;

use crate::api::{self, AppState};
use crate::config::ServerConfig;
use crate::engine::Engine;
use tokio::net::TcpListener;

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
    tracing::info!("shutting down");
}

pub async fn run(config: ServerConfig) -> anyhow::Result<()> {
    let names = config.models.iter().map(|m| m.served_name.clone()).collect();
    let media = crate::input::media::MediaOptions {
        allowed_domains: config.allowed_media_domains.clone(),
        fetch_timeout: config.media_fetch_timeout,
        max_bytes: config.payload_limit,
    };
    let api_options = api::ApiOptions {
        api_keys: config.api_keys.clone(),
        max_client_batch_size: config.max_client_batch_size,
        trust_request_chat_template: config.trust_request_chat_template,
        media,
        allow_runtime_lora_updating: config.allow_runtime_lora_updating,
        public_prefix: format!("{}{}", config.root_path, config.url_prefix),
    };
    let state = match &config.on_demand {
        Some(limits) => AppState::on_demand(
            config.models.clone(),
            api_options,
            api::on_demand::OnDemandOptions {
                max_loaded: limits.max_loaded,
                max_memory: limits.max_memory,
                idle_timeout: limits.idle_timeout,
                load_timeout: limits.load_timeout,
                engine: config.engine.clone(),
                payload_limit: config.payload_limit,
                plugins: config.plugins.clone(),
            },
        ),
        None => AppState::new(names, api_options),
    };
    let mut app = prefix::under(api::router(state.clone(), config.payload_limit), &config.url_prefix);
    if let Some(options) = &config.cors {
        app = app.layer(cors::layer(options));
        tracing::info!("CORS: answering browsers from {:?}", options.origins);
    }
    if let Some(telemetry) = &config.telemetry {
        crate::telemetry::start(telemetry)?;
        tracing::info!("tracing requests to {} (OTLP/gRPC, service.name {})", telemetry.endpoint, telemetry.service_name);
    }
    let acceptor = config.tls.as_ref().map(tls::acceptor).transpose()?;
    let stop = drain_on_signal(state.clone(), config.shutdown_timeout);
    let mut server = match &config.uds {
        Some(path) => {
            let listener = unix_listener(path)?;
            tracing::info!("listening on unix:{} (HTTP/1.1, HTTP/2, gRPC)", path.display());
            tokio::spawn(connections::serve(listener, app, stop))
        }
        None => {
            let listener = TcpListener::bind((config.host.as_str(), config.port))
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {}:{}: {e}", config.host, config.port))?;
            let scheme = if acceptor.is_some() { "https" } else { "http" };
            tracing::info!("listening on {scheme}://{}{} (HTTP/1.1, HTTP/2, gRPC)", listener.local_addr()?, config.url_prefix);
            tokio::spawn(async move {
                match acceptor {
                    Some(acceptor) => connections::serve(tls::TlsListener::new(listener, acceptor)?, app, stop).await,
                    None => connections::serve(axum::serve::ListenerExt::tap_io(listener, connections::no_delay), app, stop).await,
                }
            })
        }
    };

    if config.on_demand.is_some() {
        tracing::info!("{} models on demand: each loads at its first request", config.models.len());
        let idle = state.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                idle.unload_idle();
            }
        });
    }
    let loading = async {
        match config.on_demand {
            Some(_) => anyhow::Ok(()),
            None => load_models(&config, &state).await,
        }
    };
    tokio::select! {
        loaded = loading => loaded?,
        // Stopped before the model was ready: nothing is in flight.
        finished = &mut server => {
            finished??;
            tracing::info!("stopped while loading");
            flush_traces().await;
            return Ok(());
        }
    }
    server.await??;
    tracing::info!("stopped");
    flush_traces().await;
    Ok(())
}

/// `--uds`: binds the socket, replacing one an earlier run left (a socket file only: any other
/// file at the path stops the server rather than being deleted).
#[cfg(unix)]
fn unix_listener(path: &std::path::Path) -> anyhow::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    let cannot = |e: &dyn std::fmt::Display| anyhow::anyhow!("cannot listen on the unix socket {}: {e}", path.display());
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(cannot(&"the path exists and is not a socket"));
        }
        std::fs::remove_file(path).map_err(|e| cannot(&e))?;
    }
    tokio::net::UnixListener::bind(path).map_err(|e| cannot(&e))
}

#[cfg(not(unix))]
fn unix_listener(path: &std::path::Path) -> anyhow::Result<std::convert::Infallible> {
    anyhow::bail!("cannot listen on the unix socket {}: Unix sockets need a Unix system", path.display())
}

/// On SIGTERM/SIGINT: /health turns 503 and new model requests are refused at once, the
/// listener closes (when the returned future ends), in-flight requests (and gRPC streams) get
/// `timeout` to finish. Idle keep-alive connections do not hold the server: an HTTP/2 client
/// that never answers the GOAWAY's ping (an idle synchronous client) would otherwise keep it
/// up until the timeout.
async fn drain_on_signal(draining: AppState, timeout: std::time::Duration) {
    shutdown_signal().await;
    draining.start_draining();
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            if crate::metrics::in_flight() <= 0 && api::grpc::open_streams() == 0 {
                tracing::info!("stopped: no request running (idle connections closed)");
                flush_traces().await;
                std::process::exit(0);
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!("shutdown timeout ({timeout:?}) reached with requests still running; exiting");
                flush_traces().await;
                std::process::exit(0);
            }
        }
    });
}

/// Every model loads and warms up at once, each on a blocking thread of its own; /health
/// turns 200 when the last is ready. One that fails stops the server.
async fn load_models(config: &ServerConfig, state: &AppState) -> anyhow::Result<()> {
    let total = config.models.len();
    let mut loads = tokio::task::JoinSet::new();
    for model in config.models.clone() {
        let options = config.engine.clone();
        loads.spawn(async move {
            let name = model.served_name.clone();
            let loaded = async {
                let engine = tokio::task::spawn_blocking(move || Engine::load(&model, &options)).await??;
                engine.warm_up().await?;
                anyhow::Ok(engine)
            };
            // With several models, the error names the one that failed.
            loaded.await.map_err(|e| if total > 1 { e.context(format!("model `{name}`")) } else { e })
        });
    }
    let mut ready = 0;
    while let Some(loaded) = loads.join_next().await {
        let engine = loaded??;
        ready += 1;
        let name = engine.spec().served_name.clone();
        if let Some(plugin) = &engine.spec().io_processor_plugin {
            let started = crate::plugin::IoProcessor::start(plugin, &config.plugins, &engine).await;
            let started = started.map_err(|e| if total > 1 { anyhow::anyhow!("model `{name}`: {e}") } else { e.into() })?;
            tracing::info!(model = %name, "IO-processor plugin `{plugin}` started");
            // gRPC has no call for a plugin's `data` (docs/plugins.md): say so where operators look.
            tracing::info!(
                model = %name,
                "IO-processor plugin `{plugin}` serves POST /pooling {{\"data\": …}} only; gRPC (tei.v1) calls run the model's own task"
            );
            state.set_plugin(&name, started);
        }
        state.set_engine(engine);
        match total {
            1 => tracing::info!("ready to serve {name}"),
            _ => tracing::info!(model = %name, "ready to serve {name} ({ready} of {total} models)"),
        }
    }
    Ok(())
}

/// Sends the request spans still queued before the process ends (at most 5 s; nothing when
/// tracing is off).
async fn flush_traces() {
    let _ = tokio::task::spawn_blocking(crate::telemetry::shutdown).await;
}
